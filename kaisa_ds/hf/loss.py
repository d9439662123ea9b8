"""The loss scale K-FAC must be told about when the HF Trainer calls a user's ``compute_loss_func``.

K-FAC's factor scaling assumes the back-propagated loss is each micro-batch's mean divided by the accumulation
passes. With a ``compute_loss_func`` the Trainer (transformers 5.24 ``compute_loss`` / ``training_step``) never
divides by the accumulation steps (``loss_is_scaled_for_ga``) and, with ``average_tokens_across_devices`` and a
token count, multiplies by the number of processes. Two conventions are common:

- *micro-batch mean* (ignores ``num_items_in_batch``): the loss back-propagated is ``world x accumulation`` times
  K-FAC's, so the gradients (and the G factors, squared) are that much larger;
- *token-count normalised* (``sum / num_items_in_batch``): the loss is the mean over the whole accumulated (and,
  with ``average_tokens_across_devices``, global) batch, which is K-FAC's convention.

Which one a function follows is measured on its first call (the same outputs at twice the count: a mean does not
change, a normalised loss halves), and the factor is set on the engine (``engine.kfac_loss_factor``) where the
preconditioner divides it out with the loss scale, so K-FAC sees the same statistics and takes the same step.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)


def wrap_compute_loss_func(trainer: Any, loss_func: Callable[..., Any]) -> Callable[..., Any]:
    """``loss_func`` unchanged, plus: on each call, tell the engine the factor between its loss and K-FAC's."""
    from kaisa_ds.engine.deepspeed_engine import LOSS_FACTOR

    convention: dict[str, bool] = {}  # "normalised": whether loss_func divides by num_items_in_batch

    @functools.wraps(loss_func)
    def compute_loss_func(outputs: Any, labels: Any, *args: Any, num_items_in_batch: Any = None,
                          **kwargs: Any) -> Any:
        loss = loss_func(outputs, labels, *args, num_items_in_batch=num_items_in_batch, **kwargs)
        if num_items_in_batch is None:
            normalised = False  # it cannot divide by a count it is not given
        else:
            if "normalised" not in convention:
                with torch.no_grad():
                    doubled = loss_func(outputs, labels, *args, num_items_in_batch=num_items_in_batch * 2, **kwargs)
                found = classify(float(loss.detach()), float(doubled))
                if found is not None:
                    convention["normalised"] = found
                    logger.info("kaisa_ds: compute_loss_func %s; K-FAC divides that out of its statistics",
                                "normalises by num_items_in_batch" if found else "returns the micro-batch mean")
            normalised = convention.get("normalised", False)
        engine = trainer.model_wrapped
        if engine is not None and hasattr(engine, "kfac"):
            setattr(engine, LOSS_FACTOR, loss_factor(trainer, normalised=normalised,
                                                     counted=num_items_in_batch is not None))
        return loss

    return compute_loss_func


def classify(loss: float, doubled: float) -> bool | None:
    """True: the loss halves when the count doubles (normalised by it); False: unchanged (a mean of its own);
    None: cannot tell from this batch (zero or non-finite). Anything else is refused: K-FAC cannot know its scale."""
    if not (math.isfinite(loss) and math.isfinite(doubled)) or loss == 0.0:
        return None
    ratio = doubled / loss
    if math.isclose(ratio, 1.0, rel_tol=1e-3):
        return False
    if math.isclose(ratio, 0.5, rel_tol=1e-3):
        return True
    raise ValueError(f"kaisa_ds: compute_loss_func returned {loss:.6g} for num_items_in_batch=n and {doubled:.6g} for "
                     "2n: it neither ignores the count (a micro-batch mean) nor divides by it (sum / count), so K-FAC "
                     "cannot tell the scale of the loss it back-propagates. Return the micro-batch mean, or the sum "
                     "of per-item losses divided by num_items_in_batch")


def loss_factor(trainer: Any, *, normalised: bool, counted: bool) -> float:
    """How much larger the loss the Trainer back-propagates for this micro-batch is than K-FAC's convention: the
    micro-batch mean divided by the passes of this window (a short window at an epoch's end has fewer; K-FAC
    scales its statistics by the passes it saw, so the model's own loss, which the Trainer divides the same way,
    needs no factor)."""
    current = int(getattr(trainer, "current_gradient_accumulation_steps", 0)
                  or trainer.args.gradient_accumulation_steps)
    divides = getattr(trainer, "loss_is_scaled_for_ga", None) is False  # else a compute_loss_func's loss is taken
    if normalised:  # as scaled: a mean over the window's (global) items, each micro-batch's share 1 / current
        per_micro_batch = 1.0 / current
    else:
        per_micro_batch = float(trainer.accelerator.num_processes
                                if counted and trainer.args.average_tokens_across_devices else 1)
    return per_micro_batch * current / (current if divides else 1)
