"""Work-around for DeepSpeed 0.19.x's fp16 ZeRO-0 loss-scaling defect, applied only where DeepSpeed shows it.

With fp16 and no ZeRO, DeepSpeed 0.19.8's ``engine.backward`` never multiplies the loss by the loss scale (only a
ZeRO optimizer's loss or a ``torch_autocast`` GradScaler's is scaled), while ``FP16_UnfusedOptimizer.step`` still
divides the gradients by it: the client optimizer receives ``grad / scale`` (upstream PR #8393). Whether the
installed DeepSpeed has the defect is measured, not read from its version: on the first backward with a loss scale
other than 1, a hook on the loss sees the factor DeepSpeed's backward applied to it (the scale, or 1 when it has
the defect) and supplies the missing scale itself. Later calls multiply the loss by the scale only if the defect
was seen, so a release that fixes DeepSpeed never gets the loss scaled twice.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

logger = logging.getLogger(__name__)


def needs_fp16_fix(engine: Any) -> bool:
    """Whether ``engine`` is of the kind that may have the defect: fp16 without a ZeRO optimizer or autocast."""
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    return (bool(engine.fp16_enabled()) and not isinstance(engine.optimizer, ZeROOptimizer)
            and getattr(engine, "torch_autocast_z0_gradscaler", None) is None)  # that path scales itself


def apply_fp16_fix(engine: Any) -> None:
    """Wrap ``engine.backward`` on this instance so the loss is multiplied by the loss scale exactly once."""
    original = engine.backward
    found: dict[str, bool] = {}  # "defect": whether DeepSpeed's backward left the loss unscaled

    def backward(loss: Any, *args: Any, **kwargs: Any) -> Any:
        scale = float(engine.optimizer.loss_scale)
        defect = found.get("defect")
        if defect is False or scale == 1.0:
            return original(loss, *args, **kwargs)
        if defect:
            return original(loss * scale, *args, **kwargs) / scale  # give the caller back their own loss
        scale_wrt_gas = kwargs.get("scale_wrt_gas", args[1] if len(args) > 1 else True)
        passes = float(engine.gradient_accumulation_steps()) if scale_wrt_gas else 1.0
        probe = loss * 1.0  # a tensor of our own to hook, not the caller's

        def measure(grad: torch.Tensor) -> torch.Tensor:
            applied = float(grad) * passes  # the factor DeepSpeed multiplied the loss by: the scale, or 1
            found["defect"] = math.isclose(applied, 1.0, rel_tol=1e-3)
            return grad * scale if found["defect"] else grad

        probe.register_hook(measure)
        returned = original(probe, *args, **kwargs)
        if found.get("defect"):
            logger.warning("kaisa_ds: this DeepSpeed's fp16 ZeRO-0 backward does not apply the loss scale (the "
                           "0.19.x defect, upstream PR #8393); engine.backward now multiplies the loss by it")
        return returned

    engine.backward = backward
