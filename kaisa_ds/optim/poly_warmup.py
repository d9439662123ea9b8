"""NVIDIA's BERT learning-rate schedule: linear warmup, then polynomial decay.

As in NVIDIA DeepLearningExamples (PyTorch/LanguageModeling/BERT/schedulers.py, PolyWarmUpScheduler):
``progress = step / total_steps``; ``lr = base · progress / warmup`` while ``progress < warmup``, else
``base · (1 − progress) ** degree`` (degree 0.5).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler


class PolyWarmUpScheduler(LRScheduler):
    """Linear warmup over ``warmup_proportion · total_steps`` steps, then ``(1 − progress) ** degree``."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, warmup_proportion: float, total_steps: int,
                 degree: float = 0.5, last_epoch: int = -1) -> None:
        if not 0 <= warmup_proportion < 1:
            raise ValueError(f"warmup_proportion={warmup_proportion!r} is not valid; allowed: in [0, 1)")
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"total_steps={total_steps!r} is not valid; allowed: an integer >= 1")
        if degree <= 0:
            raise ValueError(f"degree={degree!r} is not valid; allowed: > 0")
        self.warmup = warmup_proportion
        self.total_steps = total_steps
        self.degree = degree
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        progress = min(step / self.total_steps, 1.0)
        if progress < self.warmup:
            return progress / self.warmup
        return (1.0 - progress) ** self.degree

    def get_lr(self) -> list[float]:  # type: ignore[override]
        f = self.factor(self.last_epoch)
        return [float(base) * f for base in self.base_lrs]

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}
