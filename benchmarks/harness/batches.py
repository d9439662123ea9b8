"""Batches in the pretraining loader's format, masked by bert_pretrain's rule (bert_pretrain.data.examples) with
its special-token ids: from given token rows, or random ids."""

from __future__ import annotations

import random
from typing import Any

import torch

from bert_pretrain.data.examples import IGNORE, ExampleSettings, Specials, mask_tokens
from bert_pretrain.data.tokenizer import SPECIAL


def trained_vocab_specials(vocab_size: int) -> Specials:
    """The special-token ids of a vocabulary bert_pretrain trains (its special tokens first, in SPECIAL's order)."""
    return Specials(pad=SPECIAL.index("[PAD]"), cls=SPECIAL.index("[CLS]"), sep=SPECIAL.index("[SEP]"),
                    mask=SPECIAL.index("[MASK]"), vocab_size=vocab_size)


def masked_batch(rows: list[list[int]], *, specials: Specials, device: torch.device | str,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Token rows (each ``seq - 2`` ids) as ``[CLS] ... [SEP]`` segments masked by bert_pretrain's ``mask_tokens``
    (15%, 80/10/10), random NSP labels: a batch in the format the pretraining data loader yields."""
    rng = random.Random(seed)
    seq = len(rows[0]) + 2
    settings = ExampleSettings(max_seq_length=seq, max_predictions=max(1, round(seq * ExampleSettings.masked_lm_prob)))
    cols: dict[str, list[Any]] = {"input_ids": [], "masked_lm_positions": [], "masked_lm_ids": []}
    for row in rows:
        masked, positions, ids = mask_tokens([specials.cls, *row, specials.sep], settings, specials, rng)
        pad = settings.max_predictions - len(positions)
        cols["input_ids"].append(masked)
        cols["masked_lm_positions"].append(positions + [0] * pad)
        cols["masked_lm_ids"].append(ids + [IGNORE] * pad)
    out = {k: torch.tensor(v) for k, v in cols.items()}
    out["token_type_ids"] = torch.zeros(len(rows), seq, dtype=torch.long)
    out["attention_mask"] = torch.ones(len(rows), seq, dtype=torch.long)
    out["next_sentence_label"] = torch.tensor([rng.randrange(2) for _ in rows])
    return {k: v.to(device) for k, v in out.items()}


def random_batch(batch: int, seq: int, vocab: int, device: torch.device | str,
                 *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids in the loader's format (see :func:`masked_batch`), with a trained vocabulary's special ids."""
    rng = random.Random(seed)
    specials = trained_vocab_specials(vocab)
    low = min(1000, vocab // 2)
    rows = [[rng.randrange(low, vocab) for _ in range(seq - 2)] for _ in range(batch)]
    return masked_batch(rows, specials=specials, device=device, seed=seed + 1)
