"""K-FAC inside the Hugging Face ``Trainer`` run with ``TrainingArguments(deepspeed=...)``: one added line,
``kaisa_ds.enable_kfac(trainer)``, and a ``"kfac"`` section in the DeepSpeed JSON.

Where DeepSpeed's step runs in the Trainer (transformers 5.24 ``Trainer._run_epoch`` / ``training_step`` with
accelerate 1.x): the Trainer marks each micro-step as an accumulation boundary or not
(``accelerator.gradient_state._set_sync_gradients(do_sync_step)``) and calls ``accelerator.backward(loss,
scale_wrt_gas=False)``; accelerate's ``DeepSpeedEngineWrapper.backward`` then runs ``engine.backward`` and, on a
boundary, ``engine.step()`` -- DeepSpeed's whole step (clip, overflow check, optimizer) happens *inside*
``accelerator.backward``. A ``TrainerCallback`` would therefore run too late; K-FAC instead wraps ``engine.step`` on
the engine instance (as ``kaisa_ds.initialize`` does), as soon as ``accelerator.prepare`` has built the engine --
before the Trainer loads a ``resume_from_checkpoint``, so the K-FAC state in the checkpoint is restored too. Every
Accelerator the Trainer builds later (``hyperparameter_search`` builds one per trial) is patched the same way, and
a callback checks at the start of every ``train()`` that the engine really has K-FAC.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from kaisa_ds.engine.ds_config import load_config, parse_kfac_section
from kaisa_ds.hf.accelerate import attach_to_accelerator, deepspeed_engine_of
from kaisa_ds.hf.loss import wrap_compute_loss_func

logger = logging.getLogger(__name__)
ENABLED = "_kaisa_ds_kfac_enabled"  # Trainer attribute: enable_kfac already ran on it


def enable_kfac(trainer: Any) -> Any:
    """Make a Hugging Face ``Trainer`` precondition with K-FAC from its DeepSpeed config's ``kfac`` section.

    Args:
        trainer: a ``transformers.Trainer`` built with ``TrainingArguments(deepspeed=...)``, before its first
            ``train()``.

    Returns:
        The same trainer. Call it once after building the Trainer, before ``trainer.train()``. The preconditioner is
    ``trainer.model_wrapped.kfac`` once training started. Checkpoints the Trainer writes (``save_steps``) carry
    the K-FAC state and ``train(resume_from_checkpoint=...)`` restores it.

    K-FAC's factors assume the back-propagated loss is the micro-batch mean divided by the accumulation passes
    (``loss_reduction="mean"``). For the model's own loss this turns the Trainer's token-count path off
    (``trainer.model_accepts_loss_kwargs = False``): the Trainer then divides each micro-batch's mean loss by the
    accumulation steps. A ``compute_loss_func`` keeps its own convention; K-FAC is told the factor by which the
    loss the Trainer back-propagates differs from its own (:mod:`kaisa_ds.hf.loss`).
    """
    if not getattr(trainer, "is_deepspeed_enabled", False):
        raise ValueError("kaisa_ds.enable_kfac: this Trainer does not use DeepSpeed, so K-FAC cannot run; pass "
                         "TrainingArguments(deepspeed='ds_config.json') (or --deepspeed ds_config.json) with a "
                         "\"kfac\" section in that config")
    if getattr(trainer, "deepspeed", None) is not None or trainer.state.global_step > 0:
        raise ValueError("kaisa_ds.enable_kfac: trainer.train() has already built the DeepSpeed engine, so K-FAC "
                         "cannot be attached any more; call kaisa_ds.enable_kfac(trainer) right after building the "
                         "Trainer, before the first trainer.train()")
    if getattr(trainer, ENABLED, False):
        logger.warning("kaisa_ds.enable_kfac: already enabled on this Trainer; this second call does nothing "
                       "(K-FAC runs once, as set up by the first call)")
        return trainer
    cfg = load_config(trainer.args.hf_deepspeed_config.config)
    section = parse_kfac_section(cfg)
    if not section.enabled:
        why = "its \"kfac\" section has \"enabled\": false" if "kfac" in cfg else "it has no \"kfac\" section"
        logger.warning("kaisa_ds.enable_kfac: K-FAC is OFF for this Trainer: the DeepSpeed config (%s) %s, so the "
                       "Trainer runs unchanged with DeepSpeed's optimizer alone. Add \"kfac\": {\"enabled\": true} "
                       "to the DeepSpeed config to precondition with K-FAC", trainer.args.deepspeed, why)
        setattr(trainer, ENABLED, True)
        return trainer
    check_node_local_checkpoints(trainer.args)
    if getattr(trainer.args, "torch_compile", False):
        raise ValueError("kaisa_ds.enable_kfac: torch_compile=True is not supported with K-FAC: its capture hooks "
                         "(forward hooks that register gradient hooks) are untested under torch.compile; set "
                         "torch_compile=False (the Trainer then trains the model uncompiled, with K-FAC)")
    if trainer.model_accepts_loss_kwargs:
        logger.info("kaisa_ds: Trainer loss normalised per micro-batch (mean / accumulation steps) for K-FAC; "
                    "num_items_in_batch is no longer passed to the model")
        trainer.model_accepts_loss_kwargs = False
    if getattr(trainer, "compute_loss_func", None) is not None:
        trainer.compute_loss_func = wrap_compute_loss_func(trainer, trainer.compute_loss_func)
    patch_accelerator(trainer.accelerator)
    create = trainer.create_accelerator_and_postprocess

    def create_then_patch(*args: Any, **kwargs: Any) -> Any:  # hyperparameter_search: a new Accelerator per trial
        result = create(*args, **kwargs)
        patch_accelerator(trainer.accelerator)
        return result

    trainer.create_accelerator_and_postprocess = create_then_patch
    trainer.add_callback(check_attached_callback(trainer))
    setattr(trainer, ENABLED, True)
    return trainer


def patch_accelerator(accelerator: Any) -> None:
    """Attach K-FAC to the engine as soon as ``accelerator.prepare`` builds it (once per accelerator)."""
    if getattr(accelerator, ENABLED, False):
        return
    prepare = accelerator.prepare

    def prepare_then_attach(*args: Any, **kwargs: Any) -> Any:
        prepared = prepare(*args, **kwargs)
        if deepspeed_engine_of(accelerator) is not None:
            attach_to_accelerator(accelerator)  # once per engine: later calls return the same preconditioner
        return prepared

    accelerator.prepare = prepare_then_attach
    setattr(accelerator, ENABLED, True)


def check_node_local_checkpoints(args: Any) -> None:
    """Refuse ``save_on_each_node`` across nodes: each node would hold only its own ranks' K-FAC shards (the
    Trainer turns on DeepSpeed's ``use_node_local_storage``), while a resume reads every rank's shard."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", args.world_size))
    if args.save_on_each_node and args.world_size > local:
        raise ValueError("kaisa_ds.enable_kfac: save_on_each_node=True on several nodes is not supported: a resume "
                         "needs the K-FAC shards of every rank, and each node's disk would hold only its own. Save "
                         "to a filesystem all nodes share (save_on_each_node=False)")


def check_attached_callback(trainer: Any) -> Any:
    """A callback that fails ``train()`` at once when the engine has no K-FAC, and sets the reporting interval
    (accelerate sets DeepSpeed's ``steps_per_print`` to infinity: K-FAC reports every ``logging_steps``)."""
    from transformers import TrainerCallback

    from kaisa_ds.engine.deepspeed_engine import REPORT_EVERY

    class KFACAttached(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            engine = trainer.model_wrapped
            if getattr(engine, "kfac", None) is None:
                raise RuntimeError("kaisa_ds.enable_kfac: K-FAC is not attached to the DeepSpeed engine this train() "
                                   "built (the Trainer's accelerator.prepare was replaced or bypassed); nothing is "
                                   "preconditioned. Call kaisa_ds.enable_kfac(trainer) on the Trainer that trains")
            every = int(state.logging_steps or 0) if args.logging_strategy == "steps" else 0
            setattr(engine, REPORT_EVERY, every)

    return KFACAttached()
