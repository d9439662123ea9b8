"""BERT for the benchmarks: bert_pretrain's model of a named size, its pretraining loss, one forward+backward."""

from __future__ import annotations

import os
from typing import Any

import torch

from bert_pretrain.model import PretrainingLoss, build_model
from kaisa_ds.plan.bert_sizes import SIZES


def bert_for_pretraining(size: str, *, vocab: int = 30522, seq: int = 128, seed: int = 0) -> torch.nn.Module:
    """HF ``BertForPreTraining`` of a named size (bert_pretrain's ``build_model``; nothing downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if size not in SIZES:
        raise ValueError(f"unknown BERT size {size!r}; allowed: {', '.join(SIZES)}")
    torch.manual_seed(seed)
    return build_model(size, vocab_size=vocab, max_positions=max(512, seq))  # type: ignore[no-any-return]


def pretraining_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """bert_pretrain's MLM + NSP loss (the vocabulary-wide decoder only at the masked positions) of ``model``."""
    return PretrainingLoss(model)(batch)  # type: ignore[no-any-return]


def fwd_bwd(model: torch.nn.Module, batch: dict[str, torch.Tensor], *, autocast: torch.dtype | None = None,
            passes: int = 1) -> None:
    """One training step's forward+backward from fresh gradients (so every copy of a model preconditions the same
    ones): ``passes`` accumulated passes over ``batch`` (gradient accumulation, each loss divided by ``passes`` as
    DeepSpeed does), under autocast to ``autocast`` when given."""
    model.zero_grad(set_to_none=True)
    for _ in range(passes):
        if autocast is None:
            loss = pretraining_loss(model, batch)
        else:
            with torch.autocast(next(iter(batch.values())).device.type, dtype=autocast):
                loss = pretraining_loss(model, batch)
        (loss / passes if passes > 1 else loss).backward()
