"""NVIDIA's BERT learning-rate schedule (linear warmup, then polynomial decay) as a standard LRScheduler.

Follows NVIDIA/DeepLearningExamples ``PyTorch/LanguageModeling/BERT/schedulers.py`` (``PolyWarmUpScheduler``,
degree 0.5) together with ``run_pretraining.py``, which calls ``lr_scheduler.step()`` just before each
``optimizer.step()``: the k-th optimizer step (k = 1, 2, …) runs with

    progress = k / total_steps
    lr = base_lr · progress / warmup_proportion     while progress < warmup_proportion
    lr = base_lr · (1 − progress) ** degree          afterwards

so the first step already has a small non-zero lr and step ``total_steps`` has lr 0. DeepSpeed steps its
``lr_scheduler`` after the optimizer and skips it on fp16 overflow, which matches NVIDIA counting only
applied optimizer steps; hence ``last_epoch + 1`` below. Beyond ``total_steps`` the lr stays 0 (NVIDIA's
formula would take a fractional power of a negative number there).
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LRScheduler

from kaisa_ds.enums import parse_count


def poly_warmup_factor(step: int, *, warmup_proportion: float, total_steps: int, degree: float = 0.5) -> float:
    """The multiplier of the base lr for the ``step``-th (1-based) optimizer step."""
    progress = min(step / total_steps, 1.0)
    if progress < warmup_proportion:
        return progress / warmup_proportion
    return (1.0 - progress) ** degree


class PolyWarmUpScheduler(LRScheduler):
    """Linear warmup over ``warmup_proportion · total_steps`` steps, then ``(1 − progress) ** degree``.

    Pass it to ``deepspeed.initialize(lr_scheduler=...)`` or step it after each optimizer step; its
    ``state_dict`` is the standard LRScheduler one, so DeepSpeed checkpoints carry it.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, warmup_proportion: float, total_steps: int,
                 degree: float = 0.5, last_epoch: int = -1) -> None:
        if isinstance(warmup_proportion, bool) or not (0.0 <= warmup_proportion < 1.0):
            raise ValueError(f"PolyWarmUpScheduler: warmup_proportion={warmup_proportion!r} is not valid; "
                             "allowed: a number in [0, 1), the share of total_steps spent warming up")
        parse_count("PolyWarmUpScheduler: total_steps", total_steps, meaning="the number of optimizer steps")
        if isinstance(degree, bool) or not (math.isfinite(degree) and degree >= 0):
            raise ValueError(f"PolyWarmUpScheduler: degree={degree!r} is not valid; allowed: a finite number >= 0 "
                             "(NVIDIA's BERT recipe uses 0.5)")
        self.warmup_proportion = float(warmup_proportion)
        self.total_steps = total_steps
        self.degree = float(degree)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        factor = poly_warmup_factor(self.last_epoch + 1, warmup_proportion=self.warmup_proportion,
                                    total_steps=self.total_steps, degree=self.degree)
        return [float(base) * factor for base in self.base_lrs]
