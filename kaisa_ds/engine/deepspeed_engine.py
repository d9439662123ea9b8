"""``kaisa_ds.initialize``: ``deepspeed.initialize`` plus K-FAC from the config's ``kfac`` section.

Order of operations on an accumulation boundary, inside the wrapped ``engine.step``:
1. DeepSpeed has reduced (averaged) the gradients during ``engine.backward``;
2. K-FAC commits the window's factors, refreshes decompositions, preconditions and KL-clips the gradients;
3. DeepSpeed's own step then unscales (fp16), checks overflow, applies ``gradient_clipping`` to the
   *preconditioned* gradients, and runs the optimizer.
So KAISA's KL-clip bounds the preconditioned step first, and ``gradient_clipping`` (if non-zero) then clips
the norm of the preconditioned gradient; ``engine.get_global_grad_norm()`` reports that norm.
On an fp16 overflow (``fp16`` or ``torch_autocast`` fp16) K-FAC first asks DeepSpeed's own overflow check, over
every parameter and every rank: when DeepSpeed will skip the step -- also for an overflow only in parameters K-FAC
does not precondition -- K-FAC drops the window on every rank and leaves the gradients alone
(``engine.kfac.skipped_windows`` counts these).

By hand (``"kfac": {"auto_step": false}``, or any time: a window already stepped by the user is not
stepped again by ``engine.step``)::

    engine.backward(loss)
    if engine.is_gradient_accumulation_boundary():
        engine.kfac.step()       # gradients are reduced here and still loss-scaled; K-FAC unscales itself
    engine.step()
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
from typing import Any

import deepspeed

from kaisa_ds.engine.checkpoint import wrap_checkpointing
from kaisa_ds.engine.ds_config import (
    KFACSection,
    check_supported,
    load_config,
    parse_kfac_section,
    poly_warmup_from_config,
)
from kaisa_ds.engine.fp16_fix import apply_fp16_fix, needs_fp16_fix
from kaisa_ds.engine.grad_access import EngineGradAccessor, engine_loss_scale, engine_skips_step
from kaisa_ds.engine.launch import skip_cpu_shm_build
from kaisa_ds.engine.monitor import report
from kaisa_ds.engine.rate_scale import DEFAULT_LR_SCALE, scale_optimizer_rate
from kaisa_ds.optim.select import is_lamb_config, lamb_from_ds_config
from kaisa_ds.preconditioner import KFACPreconditioner

logger = logging.getLogger(__name__)
LOSS_FACTOR = "kfac_loss_factor"  # engine attribute: how much larger the back-propagated loss is than K-FAC's
# convention (micro-batch mean / accumulation passes), beyond the loss scale; set by callers that know it (the Trainer)
REPORT_EVERY = "kfac_report_every"  # engine attribute: report every this many steps when steps_per_print is unusable
KFAC_OF_MODULE = "_kaisa_ds_kfac"  # module attribute: the preconditioner whose hooks are on it


def initialize(args: Any = None, model: Any = None, optimizer: Any = None, model_parameters: Any = None,
               training_data: Any = None, lr_scheduler: Any = None, config: Any = None,
               **kwargs: Any) -> tuple[Any, Any, Any, Any]:
    """``deepspeed.initialize`` plus K-FAC from the config's ``kfac`` section: the same arguments and returns, and
    ``engine.kfac`` is the :class:`~kaisa_ds.preconditioner.KFACPreconditioner` (None, with a warning, when the
    section is absent or disabled). ``engine.step()`` then runs K-FAC on each accumulation boundary, and
    ``engine.save_checkpoint`` / ``load_checkpoint`` carry its state.

    Args:
        args: an argparse namespace as DeepSpeed takes it; its ``deepspeed_config`` is the config when ``config``
            is None.
        model: the ``nn.Module`` to train (needed for a ``"Lamb"`` optimizer section: its parameter groups).
        optimizer: a torch optimizer; None: the config's ``optimizer`` section (``"Lamb"`` gets the best LAMB
            available, :mod:`kaisa_ds.optim.select`).
        model_parameters: parameters or parameter groups for an optimizer DeepSpeed builds.
        training_data: a dataset DeepSpeed wraps in its data loader.
        lr_scheduler: a scheduler; None: the config's ``lr_schedule`` section (NVIDIA's poly warm-up) if any.
        config: the DeepSpeed config, a dict or a JSON/HJSON path, with an optional ``kfac`` section
            (:meth:`~kaisa_ds.config.KFACConfig.from_dict` keys plus ``enabled`` and ``auto_step``).
        kwargs: passed on to ``deepspeed.initialize`` (``config_params`` is taken as ``config``).

    Returns:
        ``(engine, optimizer, training_dataloader, lr_scheduler)``, as ``deepspeed.initialize``.
    """
    if config is None and kwargs.get("config_params") is not None:  # deepspeed.initialize's old name
        config = kwargs.pop("config_params")
    cfg = load_config(config, args)
    if args is not None and getattr(args, "deepspeed_config", None):
        args = copy.copy(args) if isinstance(args, argparse.Namespace) else args
        args.deepspeed_config = None  # the config now travels as a dict (DeepSpeed refuses both)
    section = parse_kfac_section(cfg)
    lamb = optimizer is None and is_lamb_config(cfg.get("optimizer"))
    check_supported(cfg, section, lamb=lamb or "lamb" in type(optimizer).__name__.lower())
    if lamb:
        if model is None:
            raise ValueError("optimizer Lamb needs model= to build its parameter groups")
        optimizer, impl = lamb_from_ds_config(cfg.pop("optimizer"), model)
        logger.info("kaisa_ds: optimizer Lamb -> %s", impl)
    if lr_scheduler is None and cfg.get("lr_schedule") is not None:
        lr_scheduler = poly_warmup_from_config(cfg["lr_schedule"])
    skip_cpu_shm_build()  # deepspeed.initialize starts torch.distributed when the caller has not
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
        training_data=training_data, lr_scheduler=lr_scheduler, config=cfg, **kwargs)
    finish_engine(engine, section, present="kfac" in cfg)
    return engine, optimizer, loader, scheduler


def enable_on_engine(engine: Any) -> KFACPreconditioner | None:
    """K-FAC from the ``kfac`` section of the config an engine was already built with (by ``accelerate``, the HF
    Trainer or any other caller of ``deepspeed.initialize``); sets and returns ``engine.kfac``.

    Same checks and wrapping as ``initialize``; calling it again on the same engine returns the same preconditioner.
    """
    if hasattr(engine, "kfac"):
        return engine.kfac  # type: ignore[no-any-return]
    cfg = load_config(engine.config)
    section = parse_kfac_section(cfg)
    client = getattr(engine, "client_optimizer", None)
    check_supported(cfg, section, lamb=is_lamb_config(cfg.get("optimizer")) or "lamb" in type(client).__name__.lower())
    return finish_engine(engine, section, present="kfac" in cfg)


def finish_engine(engine: Any, section: KFACSection, *, present: bool) -> KFACPreconditioner | None:
    """What every freshly built engine needs: the fp16 ZeRO-0 loss-scaling fix (where DeepSpeed has the defect) and,
    if enabled, K-FAC.

    A config without an enabled ``kfac`` section gets a warning: the caller asked kaisa_ds for K-FAC."""
    if needs_fp16_fix(engine):
        apply_fp16_fix(engine)
    engine.kfac = None
    if section.enabled:
        assert section.config is not None
        engine.kfac = attach_kfac(engine, section.config, auto_step=section.auto_step, lr_scale=section.lr_scale)
    else:
        why = "its \"kfac\" section has \"enabled\": false" if present else "it has no \"kfac\" section"
        logger.warning("kaisa_ds: K-FAC is OFF: the DeepSpeed config given to this engine has no enabled K-FAC "
                       "(%s), so DeepSpeed trains with its optimizer alone. Add \"kfac\": {\"enabled\": true, ...} "
                       "to the config to precondition with K-FAC", why)
    return engine.kfac  # type: ignore[no-any-return]


def attach_kfac(engine: Any, config: Any, *, auto_step: bool = True,
                lr_scale: float = DEFAULT_LR_SCALE) -> KFACPreconditioner:
    """Build the preconditioner for a DeepSpeed engine; with ``auto_step`` it runs inside ``engine.step``. The
    optimizer steps at ``lr_scale`` × its scheduled rate, and the KL clip assumes that rate."""
    previous = getattr(engine.module, KFAC_OF_MODULE, None)
    if previous is not None:  # a second engine on the same model (the Trainer's auto_find_batch_size retry)
        previous.remove_hooks()
        logger.info("kaisa_ds: removed the hooks of the K-FAC preconditioner of this model's previous engine")
    kfac = KFACPreconditioner(
        engine.module, config=config, grad_accessor=EngineGradAccessor(zero_stage=engine.zero_optimization_stage()),
        loss_scale=lambda: engine_loss_scale(engine) * float(getattr(engine, LOSS_FACTOR, 1.0)),
        lr=lambda step: float(engine.get_lr()[0]) * lr_scale,
        accumulation_steps=int(engine.gradient_accumulation_steps()))  # the last pass starts factor reductions
    object.__setattr__(engine.module, KFAC_OF_MODULE, kfac)  # a plain attribute: not a submodule or state
    wrap_checkpointing(engine, kfac)
    wrap_step(engine, kfac, auto_step=auto_step)
    scale_optimizer_rate(getattr(engine, "basic_optimizer", None), lr_scale)
    logger.info("kaisa_ds: K-FAC attached to %d layers (world %d, %d gradient workers per layer, auto_step=%s, "
                "eigenvalues=%s)", len(kfac.layers), kfac.world, kfac.grad_workers, auto_step,
                kfac.config.scaling.value)
    return kfac


def wrap_step(engine: Any, kfac: KFACPreconditioner, *, auto_step: bool) -> None:
    """On accumulation boundaries, run K-FAC before DeepSpeed's step (unless this window's K-FAC step was
    already called by hand) and report timings every ``report_interval`` steps. A window DeepSpeed will skip for
    an overflow (anywhere: also in parameters K-FAC does not precondition) is dropped instead of committed, by
    ``engine.step`` and by ``engine.kfac.step()`` called by hand alike."""
    original_step, kfac_step = engine.step, kfac.step
    window = {"stepped": False}  # whether this window's K-FAC step already ran

    def step_kfac() -> None:
        if engine_skips_step(engine):  # a collective on fp16 engines: every rank steps here
            skip_window(kfac)
        else:
            kfac_step()
        window["stepped"] = True

    def step(*args: Any, **kwargs: Any) -> Any:
        if engine.is_gradient_accumulation_boundary():
            every = report_interval(engine)
            print_now = every > 0 and (engine.global_steps + 1) % every == 0
            if auto_step and not window["stepped"]:
                kfac.timer.sync = print_now  # exact GPU timings only on reporting steps
                kfac.step()  # the attribute: callers may have wrapped it again
            if print_now and (window["stepped"] or auto_step):
                report(engine, kfac)
            window["stepped"] = False
        return original_step(*args, **kwargs)

    kfac.step = step_kfac  # type: ignore[method-assign]
    engine.step = step


def skip_window(kfac: KFACPreconditioner) -> None:
    """Drop the window DeepSpeed is about to skip, as K-FAC drops a window of its own with non-finite values."""
    if kfac.structure is not None and kfac.config.overlap_factor_reduction:
        kfac.window_reducer().finish(kfac.structure.factors())  # complete the all-reduces the hooks started
    kfac.take_capture_seconds()
    kfac.drop_window()
    logger.warning("kaisa_ds: DeepSpeed skips step %d (gradient overflow); the K-FAC window is dropped too "
                   "(%d skipped so far)", kfac.steps - 1, kfac.skipped_windows)


def report_interval(engine: Any) -> int:
    """Steps between K-FAC reports: ``steps_per_print`` when it is a positive integer; else the interval a caller
    set (``engine.kfac_report_every``: the Trainer's ``logging_steps``, since accelerate sets ``steps_per_print``
    to infinity); else 0, never (DeepSpeed 0.19's default ``steps_per_print`` is None)."""
    every = engine.steps_per_print()
    if isinstance(every, (int, float)) and math.isfinite(every) and every >= 1:
        return int(every)
    return int(getattr(engine, REPORT_EVERY, 0) or 0)
