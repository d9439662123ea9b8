"""Where DeepSpeed keeps the reduced gradients between ``engine.backward`` and ``engine.step``, per mode.

- BF16_Optimizer (bf16 + ``grad_accum_dtype=fp32``): ``p._hp_grad``, a full-size FP32 accumulator; writing
  ``p.grad`` there would be silently ignored by its ``step()``.
- ZeRO-0 (fp32, fp16, bf16): the module's ``p.grad``.
- ZeRO-1/2: ``p.grad`` is None on the boundary; ``safe_get_full_grad`` / ``safe_set_full_grad`` (each an
  all-reduce, so every rank must call them in the same order, which the preconditioner guarantees).
"""

from __future__ import annotations

import torch
from torch import nn


class EngineGradAccessor:
    """Reads and writes the full, rank-averaged (still loss-scaled) gradient of a DeepSpeed engine's params."""

    def __init__(self, *, zero_stage: int) -> None:
        self.zero_stage = zero_stage

    def get(self, param: nn.Parameter) -> torch.Tensor | None:
        hp = getattr(param, "_hp_grad", None)
        if hp is not None:
            return hp.view_as(param)
        if param.grad is not None:
            return param.grad
        if self.zero_stage in (1, 2):
            from deepspeed.utils import safe_get_full_grad

            return safe_get_full_grad(param)
        return None

    def set(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        hp = getattr(param, "_hp_grad", None)
        if hp is not None:
            hp.copy_(grad.reshape(hp.shape).to(hp.dtype))
        elif param.grad is not None:
            param.grad.copy_(grad)
        elif self.zero_stage in (1, 2):
            from deepspeed.utils import safe_set_full_grad

            safe_set_full_grad(param, grad)
