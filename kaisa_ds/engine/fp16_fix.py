"""Work-around for DeepSpeed 0.19.x's fp16 ZeRO-0 loss-scaling defect.

With fp16 and no ZeRO, ``engine.backward`` never multiplies the loss by the loss scale (only a ZeRO
optimizer's loss is scaled), while ``FP16_UnfusedOptimizer.step`` still divides the gradients by it:
the client optimizer receives ``grad / scale`` (upstream PR #8393). Multiplying the loss by the
current scale before ``engine.backward`` restores the intended behaviour; the fix is applied only
to the versions known to have the defect.
"""

from __future__ import annotations

import logging
from typing import Any

from packaging.version import Version

logger = logging.getLogger(__name__)

AFFECTED = (Version("0.19.0"), Version("0.20.0"))


def needs_fp16_fix(engine: Any, ds_version: str) -> bool:
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    version = Version(ds_version.split("+")[0])
    return (AFFECTED[0] <= version < AFFECTED[1] and bool(engine.fp16_enabled())
            and not isinstance(engine.optimizer, ZeROOptimizer)
            and getattr(engine, "torch_autocast_z0_gradscaler", None) is None)  # that path scales itself


def apply_fp16_fix(engine: Any) -> None:
    """Wrap ``engine.backward`` on this instance to scale the loss as DeepSpeed should have."""
    original = engine.backward

    def backward(loss: Any, *args: Any, **kwargs: Any) -> Any:
        scale = float(engine.optimizer.loss_scale)
        returned = original(loss * scale, *args, **kwargs)
        return returned / scale  # DeepSpeed returns the loss it back-propagated: give the caller theirs

    engine.backward = backward
    logger.warning("kaisa_ds: applied the DeepSpeed 0.19.x fp16 ZeRO-0 loss-scaling fix (engine.backward now "
                   "multiplies the loss by the current loss scale)")
