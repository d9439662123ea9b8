"""Where DeepSpeed keeps the reduced gradients between ``engine.backward`` and ``engine.step``, per mode.

- BF16_Optimizer (bf16 + ``grad_accum_dtype=fp32``): ``p._hp_grad``, a full-size FP32 accumulator; writing
  ``p.grad`` there would be silently ignored by its ``step()``.
- ZeRO-0 (fp32, fp16, bf16): the module's ``p.grad``.
- ZeRO-1/2: ``p.grad`` is None on the boundary; ``safe_get_full_grad`` / ``safe_set_full_grad`` (each an
  all-reduce, so every rank must call them in the same order, which the preconditioner guarantees).
"""

from __future__ import annotations

from typing import Any

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

    def target(self, param: nn.Parameter) -> torch.Tensor | None:
        hp = getattr(param, "_hp_grad", None)
        return hp.view_as(param) if hp is not None else param.grad  # None under ZeRO-1/2: set() gathers

    def set(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        hp = getattr(param, "_hp_grad", None)
        if hp is not None:
            hp.copy_(grad.reshape(hp.shape).to(hp.dtype))
        elif param.grad is not None:
            param.grad.copy_(grad)
        elif self.zero_stage in (1, 2):
            from deepspeed.utils import safe_set_full_grad

            safe_set_full_grad(param, grad)


def engine_loss_scale(engine: Any) -> float:
    """The factor DeepSpeed multiplied the loss by before ``backward``: the fp16 optimizer's dynamic scale, or the
    ``torch.amp.GradScaler`` DeepSpeed keeps for ``"torch_autocast": {"dtype": "fp16"}`` (ZeRO-0 on the engine,
    ZeRO-1/2 on the optimizer); 1.0 for fp32 and bf16."""
    for scaler in (getattr(engine, "torch_autocast_z0_gradscaler", None),
                   getattr(engine.optimizer, "torch_autocast_gradscaler", None)):
        if scaler is not None and scaler.is_enabled():
            return float(scaler.get_scale())
    return float(getattr(engine.optimizer, "loss_scale", 1.0))


def engine_skips_step(engine: Any) -> bool:
    """Whether DeepSpeed's coming ``step()`` will skip this window for an overflow, decided as DeepSpeed decides it
    (over every parameter, all ranks agreeing). A collective on fp16 engines: every rank calls it on the boundary.
    Always False for fp32 and bf16, which DeepSpeed never skips."""
    optimizer = engine.optimizer
    if getattr(engine, "torch_autocast_z0_gradscaler", None) is not None:  # its step skips on any inf
        return _any_rank(not all(bool(torch.isfinite(p.grad).all()) for p in engine.module.parameters()
                                 if p.grad is not None), engine)
    zero = hasattr(optimizer, "has_overflow") and hasattr(optimizer, "averaged_gradients")  # ZeRO-1/2
    if not (engine.fp16_enabled() or (zero and getattr(optimizer, "torch_autocast_gradscaler", None) is not None)):
        return False
    checker = getattr(optimizer, "overflow_checker", None)
    if checker is not None:  # FP16_UnfusedOptimizer / FP16_Optimizer (ZeRO-0): all-reduces the flag itself
        return bool(checker.check())
    if zero:  # over this rank's partition, all-reduced
        return bool(optimizer.has_overflow(partition_gradients=True))
    return False


def _any_rank(flag: bool, engine: Any) -> bool:
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return flag
    device = next(engine.module.parameters()).device
    t = torch.tensor([float(flag)], device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item() > 0)
