"""One K-FAC step, phase by phase: reduce → check → commit → decompose → precondition → clip → write.

Every check that can refuse a step runs before anything is changed, so an error leaves the preconditioner
as it was; the state changes (factor commits, decompositions, gradients, the step counter) happen after.
Each phase is a function over the preconditioner's public surface (:class:`StepOwner`).
"""

from __future__ import annotations

import logging
import weakref
from typing import Protocol

import torch

from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.decompose import Decomposition, decompose_all, from_tensors, layout
from kaisa_ds.diagnostics import DecompositionFailed, Diagnostics
from kaisa_ds.distributed.reduction import WindowReducer
from kaisa_ds.layers.modules import GradAccessor, ParamGradAccessor
from kaisa_ds.precondition import effectiveness
from kaisa_ds.precondition.apply import kl_clip_scale
from kaisa_ds.precondition.grouped import GroupedPreconditioner
from kaisa_ds.structure import LayerStructure
from kaisa_ds.timing import StageTimer

logger = logging.getLogger(__name__)

STAGES = ("factor_capture", "factor_reduction", "decomposition", "preconditioning", "gradient_broadcast",
          "kl_clip", "write_grads")


class StepOwner(Protocol):
    """What a step reads and changes: the preconditioner's public surface."""

    config: KFACConfig
    grads: GradAccessor
    world: int
    rank: int
    steps: int
    skipped_windows: int
    decompositions: dict[str, Decomposition]
    grouped: GroupedPreconditioner
    timer: StageTimer
    comm_bytes: dict[str, int]
    needs_decomposition: bool
    watermark: GradWatermark
    diagnostics: Diagnostics

    def ensure_structure(self) -> LayerStructure: ...

    def loss_scale(self) -> float: ...

    def discard_window(self) -> None: ...

    def take_capture_seconds(self) -> float: ...

    def window_reducer(self) -> WindowReducer: ...


class GradWatermark:
    """Remembers the gradient tensors a step wrote, to notice a second step without a new backward pass.

    Only for gradients held in ``param.grad`` (the default accessor): the same tensor object at the same
    version counter means nothing has touched it since K-FAC wrote it. Engines guard this themselves.
    """

    def __init__(self) -> None:
        self._seen: list[tuple[weakref.ref[torch.Tensor], int]] = []

    def record(self, accessor: GradAccessor, params: list[torch.nn.Parameter]) -> None:
        if not isinstance(accessor, ParamGradAccessor):
            return
        grads = [p.grad for p in params]
        self._seen = [(weakref.ref(g), g._version) for g in grads if g is not None]

    def unchanged(self, accessor: GradAccessor, params: list[torch.nn.Parameter]) -> bool:
        if not self._seen or not isinstance(accessor, ParamGradAccessor):
            return False
        grads = [p.grad for p in params if p.grad is not None]
        return len(grads) == len(self._seen) and all(
            ref() is g and g._version == version for (ref, version), g in zip(self._seen, grads))


def reduce_window(p: StepOwner, s: LayerStructure) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """All-reduce (average) the window statistics of every factor (waiting on buckets the backward pass
    started); factors no rank captured are left out. Values are ``(payload, scale)``: see
    :meth:`~kaisa_ds.factors.factor.KroneckerFactor.window_payload`.

    Ranks that captured nothing for a factor send zeros; a per-factor count of contributing ranks
    keeps the average exact, and keeps every rank's bucket layout identical.
    """
    reduced, sent = p.window_reducer().finish(s.factors())
    p.comm_bytes["factor_allreduce"] = p.comm_bytes.get("factor_allreduce", 0) + sent
    return reduced


def read_grads(p: StepOwner, s: LayerStructure) -> dict[str, torch.Tensor]:
    """Every layer's (out, in) gradient matrix, unscaled; layers without a gradient are left out."""
    scale = p.loss_scale()
    grads: dict[str, torch.Tensor] = {}
    for name, layer in s.layers.items():
        mat = layer.helper.grad_matrix(p.grads)
        if mat is not None:
            grads[name] = mat / scale if scale != 1.0 else mat
    return grads


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """One host sync for the whole step's overflow decision."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def placeholder(p: StepOwner, s: LayerStructure, name: str) -> list[torch.Tensor]:
    """Zeros shaped like a factor's decomposition tensors plus a validity flag (0: the sender has none)."""
    f = s.factors()[name]
    device = next(iter(s.layers.values())).helper.weight.device
    dtype = p.config.inv_dtype
    shapes = layout(f.dim, diagonal=f.diagonal, method=p.config.method.value) + [(1,)]
    return [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]  # type: ignore[arg-type]


def with_flag(p: StepOwner, s: LayerStructure, name: str) -> list[torch.Tensor]:
    """A factor's decomposition tensors and a validity flag of 1 (the placeholder when there is none)."""
    dec = p.decompositions.get(name)
    if dec is None:
        return placeholder(p, s, name)
    tensors = dec.tensors()
    return [*tensors, torch.ones(1, dtype=tensors[0].dtype, device=tensors[0].device)]


def update_decompositions(p: StepOwner, s: LayerStructure) -> None:
    """Decompose the factors this rank is assigned, then share them within worker groups."""
    cfg = p.config
    mine = {name: (f.value, f.diagonal) for name, f in s.factors().items()
            if s.decomposes(name, p.rank) and f.has_value}
    fresh = decompose_all({n: (v, d) for n, (v, d) in mine.items() if v is not None}, method=cfg.method.value,
                          damping=cfg.damping_at(p.steps), compute_dtype=cfg.decomposition_dtype,  # type: ignore[arg-type]
                          out_dtype=cfg.inv_dtype)  # type: ignore[arg-type]
    p.decompositions.update({n: d for n, d in fresh.items() if d is not None})
    check_failures(p, s, tried=list(fresh), failed=[n for n, d in fresh.items() if d is None])
    local = {name: with_flag(p, s, name) for name in s.factors() if s.decomposes(name, p.rank)}
    received = s.comm.broadcast_decompositions(s.unit_factors, local, lambda n: placeholder(p, s, n))
    if received:
        names = list(received)
        valid = torch.cat([received[n][-1].float() for n in names]).tolist()  # one host sync for all flags
        p.decompositions.update({n: from_tensors(received[n][:-1], method=cfg.method.value)
                                 for n, ok in zip(names, valid) if ok > 0})
    p.grouped.invalidate()
    p.diagnostics.effectiveness_due = True
    p.diagnostics.eigen_ranges_from({f: (s.factor_labels[f], d.eigvals) for f, d in p.decompositions.items()
                                     if d.eigvals is not None and f in s.factor_labels})


def check_failures(p: StepOwner, s: LayerStructure, *, tried: list[str], failed: list[str]) -> None:
    """Count consecutive failures per factor; stop every rank alike once one factor exceeds the limit."""
    p.diagnostics.record_decompositions(p.steps, tried=tried, failed=failed)
    name, count = p.diagnostics.worst_failure()
    code = count * p.world + (p.world - 1 - p.rank)  # the longest run of failures, lowest rank on ties
    if p.world > 1:  # once per decomposition step: every rank must take the same decision
        device = next(iter(s.layers.values())).helper.weight.device
        flag = torch.tensor([code], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        p.comm_bytes["decomposition_broadcast"] = p.comm_bytes.get("decomposition_broadcast", 0) + 8
        code = int(flag.item())
    worst_count, worst_rank = code // p.world, p.world - 1 - code % p.world
    limit = p.config.max_decomposition_failures
    if worst_count > limit:
        where = name if worst_rank == p.rank else f"a factor decomposed on rank {worst_rank}"
        raise DecompositionFailed(
            f"K-FAC: the decomposition of {where} failed {worst_count} times in a row (FP32 and FP64; "
            f"max_decomposition_failures={limit}): its factor is not finite or not symmetric positive semi-definite. "
            "Raise damping, lower the learning rate, or skip the layer with skip_layers")


def precondition_local(p: StepOwner, s: LayerStructure, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Precondition the layers this rank is a gradient worker for (unpreconditioned if no decomposition)."""
    pairs, out = {}, {}
    for name, layer in s.layers.items():
        if name not in grads or not s.preconditions(name, p.rank):
            continue
        a, g = p.decompositions.get(layer.a.name), p.decompositions.get(layer.g.name)
        if a is None or g is None:
            out[name] = grads[name]
        else:
            pairs[name] = (a, g)
    out.update(p.grouped.apply(grads, pairs, damping=p.config.damping_at(p.steps)))
    return out


def broadcast_gradients(p: StepOwner, s: LayerStructure, grads: dict[str, torch.Tensor],
                        pre: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Preconditioned gradients of every layer with a gradient, from their workers (MEM/HYBRID-OPT)."""
    unit_layers = {u: [n for n in names if n in grads] for u, names in s.unit_layers.items()}
    pre.update(s.comm.broadcast_gradients(unit_layers, pre, lambda n: [torch.empty_like(grads[n])]))
    return pre


def run_step(p: StepOwner) -> None:
    """The whole K-FAC step (see the module docstring)."""
    s = p.ensure_structure()  # raises before changing anything when no layer fired
    params = [ly.helper.weight for ly in s.layers.values()]
    if p.watermark.unchanged(p.grads, params):
        logger.warning("K-FAC: step() called again without a new backward pass: the gradients are already "
                       "preconditioned; nothing done (step %d)", p.steps)
        return
    timer = p.timer
    timer.reset()
    timer.add("factor_capture", p.take_capture_seconds())
    step = p.steps
    grads = read_grads(p, s)
    if not grads:
        raise RuntimeError("K-FAC: no preconditioned layer has a gradient; call loss.backward() before "
                           "precond.step() (the step counter and the statistics are unchanged)")
    with timer.stage("factor_reduction"):
        window = reduce_window(p, s) if step % p.config.value("factor_update_steps", step) == 0 else {}
    checked = [t for pair in window.values() for t in pair if t is not None]
    if not all_finite(checked + list(grads.values())):
        p.skipped_windows += 1
        p.discard_window()
        logger.warning("K-FAC: non-finite statistics or gradients at step %d; window dropped on every rank "
                       "and gradients left alone (%d skipped so far)", step, p.skipped_windows)
        p.steps += 1
        return
    decay = p.config.value("factor_decay", step)
    factors = s.factors()
    for name, (stat, stat_scale) in window.items():
        factors[name].commit(stat, decay, stat_scale)
    p.discard_window()
    if step % p.config.value("inv_update_steps", step) == 0 or p.needs_decomposition:
        with timer.stage("decomposition"):
            update_decompositions(p, s)
        p.needs_decomposition = False
    with timer.stage("preconditioning"):
        pre = precondition_local(p, s, grads)
        if p.diagnostics.effectiveness_due:  # decomposition steps only: they sync anyway
            effectiveness.check(p, s, grads, pre)
    with timer.stage("gradient_broadcast"):
        pre = broadcast_gradients(p, s, grads, pre)
    with timer.stage("kl_clip"):
        names = [n for n in s.layers if n in pre]
        kl, lr = p.config.value("kl_clip", step), p.config.value("lr", step)
        nu = (kl_clip_scale([pre[n] for n in names], [grads[n] for n in names], lr=lr, kl_clip=kl)
              if kl is not None else None)
        damping = p.config.damping_at(step)
        p.diagnostics.record_step(kl_scale=nu, damping=damping.value, lr=lr, damping_mode=damping.mode.value)
    with timer.stage("write_grads"):
        scale = p.loss_scale()
        for n in names:
            out = pre[n] * nu if nu is not None else pre[n]
            s.layers[n].helper.write_grad(p.grads, out * scale if scale != 1.0 else out)
    p.watermark.record(p.grads, params)
    p.steps += 1

