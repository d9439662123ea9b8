"""BERT for pretraining from a named size or a local model folder, and its MLM + NSP loss.

The 30k-wide MLM decoder is applied only at the masked positions (gathered first): the same loss as applying it
everywhere, at a fraction of the cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SIZES = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072),
         "large": (1024, 24, 16, 4096)}  # hidden, layers, heads, intermediate


def build_model(size_or_dir: str, *, vocab_size: int, max_positions: int = 512) -> Any:
    """``BertForPreTraining``: from a saved folder (phase 2 from phase 1), or freshly initialised as BERT does."""
    from transformers import BertConfig, BertForPreTraining

    path = Path(size_or_dir)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is not a model folder (no config.json); pass a size: {', '.join(SIZES)}")
        model = BertForPreTraining.from_pretrained(str(path), local_files_only=True)
        if model.config.vocab_size != vocab_size:
            raise ValueError(f"{path} has a vocabulary of {model.config.vocab_size} tokens but the data uses "
                             f"{vocab_size}; prepare the data with that model's vocab.txt (--vocab)")
        return model
    if size_or_dir not in SIZES:
        raise ValueError(f"--model-size {size_or_dir!r}: not a folder nor one of {', '.join(SIZES)}")
    hidden, layers, heads, inter = SIZES[size_or_dir]
    return BertForPreTraining(BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                         num_attention_heads=heads, intermediate_size=inter,
                                         max_position_embeddings=max_positions))


@dataclass
class Losses:
    loss: torch.Tensor
    mlm: torch.Tensor
    nsp: torch.Tensor
    mlm_correct: torch.Tensor
    mlm_count: torch.Tensor
    nsp_correct: torch.Tensor
    nsp_count: int


def pretraining_losses(model: Any, batch: dict[str, torch.Tensor]) -> Losses:
    out = model.bert(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                     attention_mask=batch["attention_mask"])
    labels = batch["mlm_labels"]
    where = labels != -100
    logits = model.cls.predictions(out.last_hidden_state[where])
    targets = labels[where]
    mlm = F.cross_entropy(logits.float(), targets)
    nsp_logits = model.cls.seq_relationship(out.pooler_output).float()
    nsp = F.cross_entropy(nsp_logits, batch["next_sentence_label"])
    return Losses(mlm + nsp, mlm.detach(), nsp.detach(), (logits.argmax(-1) == targets).sum(),
                  where.sum(), (nsp_logits.argmax(-1) == batch["next_sentence_label"]).sum(),
                  int(batch["next_sentence_label"].numel()))
