"""K-FAC inside the Hugging Face ``Trainer`` run with ``TrainingArguments(deepspeed=...)``: one added line,
``kaisa_ds.enable_kfac(trainer)``, and a ``"kfac"`` section in the DeepSpeed JSON.

Where DeepSpeed's step runs in the Trainer (transformers 5.23 ``Trainer._run_epoch`` / ``training_step`` with
accelerate 1.x): the Trainer marks each micro-step as an accumulation boundary or not
(``accelerator.gradient_state._set_sync_gradients(do_sync_step)``) and calls ``accelerator.backward(loss,
scale_wrt_gas=False)``; accelerate's ``DeepSpeedEngineWrapper.backward`` then runs ``engine.backward`` and, on a
boundary, ``engine.step()`` -- DeepSpeed's whole step (clip, overflow check, optimizer) happens *inside*
``accelerator.backward``. The Trainer's own ``_clip_grad_norm``, ``on_pre_optimizer_step`` callbacks and
``optimizer.step()`` come after it and are read-only or no-ops under DeepSpeed. A ``TrainerCallback`` would
therefore run too late; K-FAC instead wraps ``engine.step`` on the engine instance (as ``kaisa_ds.initialize``
does), as soon as ``accelerator.prepare`` has built the engine -- before the Trainer loads a
``resume_from_checkpoint``, so the K-FAC state in the checkpoint is restored too.
"""

from __future__ import annotations

import logging
from typing import Any

from kaisa_ds.engine.accelerate_loop import attach_to_accelerator, deepspeed_engine_of

logger = logging.getLogger(__name__)


def enable_kfac(trainer: Any) -> Any:
    """Make ``trainer`` precondition with K-FAC from its DeepSpeed config's ``kfac`` section; returns the trainer.

    Call it once after building the Trainer, before ``trainer.train()``. The preconditioner is
    ``trainer.model_wrapped.kfac`` once training started. Checkpoints the Trainer writes (``save_steps``) carry
    the K-FAC state and ``train(resume_from_checkpoint=...)`` restores it.

    The micro-batch loss must be its mean divided by the accumulation passes, the convention K-FAC's factor
    scaling assumes (``loss_reduction="mean"``) and what ``kaisa_ds.initialize`` and accelerate do. The Trainer
    instead normalises by a token count (``num_items_in_batch``) for models whose ``forward`` takes ``**kwargs``,
    and multiplies by the world size; models that ignore that count (``BertForMaskedLM`` in transformers 5.23)
    then back-propagate ``world`` x their mean loss, never divided by the accumulation steps. So this turns
    the token-count path off (``trainer.model_accepts_loss_kwargs = False``): the Trainer divides each
    micro-batch's mean loss by the accumulation steps.
    """
    if not getattr(trainer, "is_deepspeed_enabled", False):
        raise ValueError("kaisa_ds.enable_kfac: this Trainer does not use DeepSpeed; pass "
                         "TrainingArguments(deepspeed='ds_config.json') (or --deepspeed ds_config.json) with a "
                         "\"kfac\" section in that config")
    if trainer.compute_loss_func is not None:
        logger.warning("kaisa_ds: compute_loss_func is set; K-FAC assumes it returns the micro-batch mean loss")
    if trainer.model_accepts_loss_kwargs:
        logger.info("kaisa_ds: Trainer loss normalised per micro-batch (mean / accumulation steps) for K-FAC; "
                    "num_items_in_batch is no longer passed to the model")
        trainer.model_accepts_loss_kwargs = False
    accelerator = trainer.accelerator
    prepare = accelerator.prepare

    def prepare_then_attach(*args: Any, **kwargs: Any) -> Any:
        prepared = prepare(*args, **kwargs)
        if deepspeed_engine_of(accelerator) is not None:
            attach_to_accelerator(accelerator)  # once per engine: later calls return the same preconditioner
        return prepared

    accelerator.prepare = prepare_then_attach
    return trainer
