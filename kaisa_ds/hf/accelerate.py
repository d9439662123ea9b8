"""K-FAC for a hand-written ``accelerate`` loop with a DeepSpeed plugin.

Where DeepSpeed's step runs there (accelerate 1.x, ``accelerate/utils/deepspeed.py``,
``DeepSpeedEngineWrapper.backward``): ``accelerator.backward(loss)`` marks the micro-step as a boundary or not
(``engine.set_gradient_accumulation_boundary(sync_gradients)``), calls ``engine.backward(loss)`` (which reduces the
gradients on a boundary) and then, on a boundary, ``engine.step()`` itself. ``optimizer.step()`` and
``optimizer.zero_grad()`` in the user's loop are no-ops (``DeepSpeedOptimizerWrapper``). So the wrapped
``engine.step`` of ``kaisa_ds.engine.deepspeed_engine`` runs K-FAC on the reduced gradients before DeepSpeed's
unscale/clip/step, inside ``accelerator.backward``, exactly as under ``kaisa_ds.initialize``.
"""

from __future__ import annotations

from typing import Any

from kaisa_ds.preconditioner import KFACPreconditioner


def deepspeed_engine_of(accelerator: Any) -> Any:
    """The DeepSpeed engine ``accelerator.prepare`` built, or None before that (or without DeepSpeed)."""
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    return None if wrapped is None else wrapped.engine


def attach_to_accelerator(accelerator: Any, *, report_every: int = 0) -> KFACPreconditioner | None:
    """Turn on K-FAC from the ``kfac`` section of the accelerator's DeepSpeed config; call it once, right after
    ``accelerator.prepare(model, optimizer, ...)`` and before ``accelerator.load_state``.
    ``accelerator.save_state`` / ``load_state`` then carry the K-FAC state (they call the engine's
    ``save_checkpoint`` / ``load_checkpoint``, which K-FAC wraps).

    Args:
        accelerator: an ``accelerate.Accelerator`` with a DeepSpeed plugin, after ``prepare`` built its engine.
        report_every: steps between K-FAC reports (a log line and DeepSpeed monitor events); 0: none. accelerate
            overwrites the config's ``steps_per_print`` with infinity, so K-FAC does not report without it.

    Returns:
        The preconditioner (also ``engine.kfac``), or None (with a warning) when the section is absent or disabled.
    """
    from kaisa_ds.engine.deepspeed_engine import REPORT_EVERY, enable_on_engine

    engine = deepspeed_engine_of(accelerator)
    if engine is None:
        raise ValueError("kaisa_ds: no DeepSpeed engine on this Accelerator; create it with a DeepSpeed plugin "
                         "(Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config='ds_config.json')) or "
                         "`accelerate launch --use_deepspeed`) and call attach_to_accelerator after "
                         "accelerator.prepare(model, optimizer, ...)")
    check_process_count(accelerator)
    if report_every:
        setattr(engine, REPORT_EVERY, int(report_every))
    return enable_on_engine(engine)


def check_process_count(accelerator: Any) -> None:
    """Refuse an Accelerator that counts other processes than torch.distributed: on CPU ranks under torchrun,
    accelerate sees a world of 1 unless ``PartialState(cpu=True)`` came first, so each rank would train the whole,
    unsharded loader while DeepSpeed (and K-FAC) reduce over every rank."""
    import torch.distributed as dist

    counted = getattr(accelerator, "num_processes", None)
    if counted is None or not dist.is_initialized():
        return
    world = dist.get_world_size()
    if int(counted) != world:
        raise ValueError(f"kaisa_ds.attach_to_accelerator: the Accelerator counts {counted} process(es) but "
                         f"torch.distributed has {world} ranks, so every rank would train on the whole, unsharded "
                         "loader; on CPU ranks create `accelerate.PartialState(cpu=True)` before the Accelerator "
                         "(cpu=True on the Accelerator itself drops DeepSpeed), or launch with `accelerate launch`")
