"""K-FAC's rate factor on a DeepSpeed engine (``"kfac": {"lr_scale": c}``): the optimizer steps at ``c`` × the rate
its scheduler set, while K-FAC preconditions.

Why the rate and not the gradient: LAMB's trust ratio and Adam's normalisation make a step's size independent of
the gradient's scale, so a preconditioned step that wants a smaller rate can only be given it through the
optimizer's rate. The factor is applied inside the base optimizer's ``step`` and undone right after it, before
DeepSpeed steps its scheduler, so every scheduler (DeepSpeed's, torch's, the HF Trainer's, chainable or not) reads
and sets unscaled rates, and ``engine.get_lr()`` reports the scheduled one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)
# K-FAC's default rate over the optimizer's: amendment 7's rule over both models' tune cells kept 1
# (docs/studies/batch_scaling.md, Part 4; a smaller factor moved K-FAC along LAMB's curve, not below it)
DEFAULT_LR_SCALE = 1.0
SCALED = "_kaisa_ds_lr_scale"  # optimizer attribute: the factor already wrapped into its step


def check_lr_scale(value: Any) -> float:
    """``kfac.lr_scale`` validated: a number > 0 (1 leaves the optimizer's rate as scheduled)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"kfac.lr_scale={value!r} is not valid; allowed: a number > 0 (K-FAC's rate over the "
                         "optimizer's scheduled rate; 1 leaves it as scheduled)")
    return float(value)


def scale_optimizer_rate(optimizer: Any, scale: float) -> None:
    """Make ``optimizer.step`` run at ``scale`` × each group's rate and restore the rates after it (an exception
    in the step restores them too). Wrapping an optimizer twice replaces the factor, never compounds it."""
    if optimizer is None:
        if scale != 1.0:
            raise ValueError(f"kfac.lr_scale={scale:g} needs the engine's optimizer, and this engine has none: "
                             "give deepspeed an optimizer (an 'optimizer' section or optimizer=) or remove the key")
        return
    if getattr(optimizer, SCALED, None) is not None:
        optimizer.step = optimizer.step.__wrapped__  # a second engine on the same optimizer: one factor
        setattr(optimizer, SCALED, None)
    if scale == 1.0:
        return
    original: Callable[..., Any] = optimizer.step

    @functools.wraps(original)
    def step(*args: Any, **kwargs: Any) -> Any:
        groups = optimizer.param_groups
        scheduled = [group["lr"] for group in groups]
        for group, lr in zip(groups, scheduled):
            group["lr"] = lr * scale
        try:
            return original(*args, **kwargs)
        finally:
            for group, lr in zip(groups, scheduled):
                group["lr"] = lr

    optimizer.step = step
    setattr(optimizer, SCALED, scale)
    logger.info("kaisa_ds: the optimizer steps at %g x its scheduled rate while K-FAC preconditions "
                "(kfac.lr_scale)", scale)
