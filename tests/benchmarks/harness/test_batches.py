"""Benchmark batches use bert_pretrain's special-token ids and masking: the ids of a vocabulary it trains, [CLS]
first and [SEP] last, 15% of the positions predicted, never a special token, most of them [MASK]."""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness.batches import random_batch, trained_vocab_specials
from bert_pretrain.data.examples import IGNORE
from bert_pretrain.data.tokenizer import load_tokenizer, train_vocab

TEXT = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "wikitext-2" / "valid.txt"


def test_special_ids_are_those_of_a_vocabulary_bert_pretrain_trains(tmp_path: Path) -> None:
    lines = [s for s in TEXT.read_text(encoding="utf-8").splitlines()[:400] if s.strip()]
    vocab = train_vocab([lines], tmp_path, vocab_size=300)
    tok = load_tokenizer(vocab)
    sp = trained_vocab_specials(len(tok))
    assert (sp.pad, sp.cls, sp.sep, sp.mask) == (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id,
                                                 tok.mask_token_id)


def test_random_batch_is_in_the_loaders_format() -> None:
    b = random_batch(4, 32, 300, "cpu", seed=3)
    sp = trained_vocab_specials(300)
    assert (b["input_ids"][:, 0] == sp.cls).all() and (b["input_ids"][:, -1] == sp.sep).all()
    positions = b["masked_lm_positions"]
    assert positions.shape == (4, round(32 * 0.15)) and (b["masked_lm_ids"] != IGNORE).all()  # every slot used
    assert ((positions > 0) & (positions < 31)).all()  # never [CLS] or [SEP]
    assert (b["masked_lm_ids"] >= 150).all()  # the original ordinary tokens, not specials
    masked = b["input_ids"].gather(1, positions)
    assert (masked == sp.mask).float().mean() > 0.5  # 80% become [MASK]
