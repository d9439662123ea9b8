"""One K-FAC step, phase by phase: reduce → check → commit → decompose → precondition → clip → write.

Every check that can refuse a step runs before anything is changed, so an error leaves the preconditioner
as it was; the state changes (factor commits, decompositions, gradients, the step counter) happen after.
Each phase is a function over what the preconditioner shows a step (:class:`StepOwner`, read only): factors and
gradients change through their own methods, and what changes of the preconditioner's own state (the step counter, a
dropped window, new decompositions, bytes sent) comes back as a :class:`StepOutcome` that the preconditioner applies.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.decompose import decompose_all, from_tensors
from kaisa_ds.decomposition.flagged import placeholder, with_flag
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.diagnostics import DecompositionFailed, Diagnostics
from kaisa_ds.distributed.collectives import max_over_ranks, sum_over_ranks
from kaisa_ds.distributed.reduction import WindowReducer
from kaisa_ds.enums import Grafting
from kaisa_ds.layers.modules import GradAccessor, GradWatermark, write_grads
from kaisa_ds.layers.noise_scale import NoiseScale
from kaisa_ds.precondition import effectiveness
from kaisa_ds.precondition.apply import fp32_norms, size_step
from kaisa_ds.precondition.grouped import GroupedPreconditioner
from kaisa_ds.schedules import COST_CALIBRATION_ROUNDS, cost_inv_update_steps
from kaisa_ds.structure import LayerStructure
from kaisa_ds.timing import StageTimer, StepClock

logger = logging.getLogger(__name__)

STAGES = ("factor_capture", "factor_reduction", "decomposition", "preconditioning", "gradient_broadcast",
          "kl_clip", "write_grads")
Decompositions = dict[str, Decomposition]


class StepOwner(Protocol):
    """What a step reads of the preconditioner; it assigns none of it (its changes come back as a
    :class:`StepOutcome`). The attributes are read only."""

    config: KFACConfig
    grads: GradAccessor
    world: int
    rank: int
    steps: int
    needs_decomposition: bool
    statistic_rows: int | None
    cost_interval: int | None
    clock: StepClock
    grouped: GroupedPreconditioner
    timer: StageTimer
    diagnostics: Diagnostics
    watermark: GradWatermark
    noise: NoiseScale

    @property
    def decompositions(self) -> Mapping[str, Decomposition]: ...

    def ensure_structure(self) -> LayerStructure: ...

    def loss_scale(self) -> float: ...

    def take_capture_seconds(self) -> float: ...

    def window_reducer(self) -> WindowReducer: ...

    def discard_window(self) -> None: ...


@dataclass
class StepOutcome:
    """What a step changed of the preconditioner's own state, for it to apply: every step advances the counter."""

    dropped: bool = False  # a non-finite window was dropped on every rank and the gradients left alone
    decompositions: Decompositions | None = None  # every decomposition in force after a refresh (None: unchanged)
    comm_bytes: dict[str, int] = field(default_factory=dict)  # bytes this rank sent, per kind of collective
    statistic_rows: int | None = None  # rows one factor update took in over every rank, first measured this step
    cost_interval: int | None = None  # the cost rule's decomposition interval, first timed this step
    finite: torch.Tensor | None = None  # a plain step's finiteness check, on the device: read a step late
    grad_sq: torch.Tensor | None = None  # |G|² of the step's gradient, on steps the noise scale measures


def reduce_window(p: StepOwner, s: LayerStructure) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor | None]], int]:
    """All-reduce (average) the window statistics of every factor (waiting on buckets the backward pass started);
    factors no rank captured are left out. Values: :meth:`~kaisa_ds.factors.factor.KroneckerFactor.window_payload`.

    Ranks that captured nothing for a factor send zeros; a per-factor count of contributing ranks
    keeps the average exact, and keeps every rank's bucket layout identical.
    """
    return p.window_reducer().finish(s.factors())


def measure_rows(p: StepOwner, s: LayerStructure) -> int | None:
    """The statistic rows this window took in over every rank (the largest over the factors: a model's token
    rows, not its pooler's), for the ``"auto"`` interval and the row cap; None when no rank captured any. One
    all-reduce: called on every rank at the same factor-update step (the first, while the rows are unknown)."""
    local = max((f.window_rows for f in s.factors().values()), default=0)
    return sum_over_ranks(local, device=s.device) or None


def time_interval(p: StepOwner, s: LayerStructure, decomposition_seconds: float) -> int | None:
    """The cost rule's interval from the median of the first rounds and the plain steps timed, the longest any rank
    needs (one all-reduce: ranks time the same steps); None: too few steps or rounds yet (the rows rule stays)."""
    plain = p.clock.plain_seconds()
    if plain is not None:
        p.clock.add_round(decomposition_seconds)
    rounds = p.clock.round_seconds(rounds=COST_CALIBRATION_ROUNDS)
    if plain is None or rounds is None:
        return None
    steps = cost_inv_update_steps(decomposition_seconds=rounds, step_seconds=plain,
                                  budget=p.config.decomposition_budget,
                                  factor_update_steps=p.config.value("factor_update_steps", p.steps))
    return max_over_ranks(steps, device=s.device)


def read_grads(p: StepOwner, s: LayerStructure) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every layer's (out, in) gradient matrix, unscaled and as read (loss-scaled); none for a layer without one."""
    scale = p.loss_scale()
    grads: dict[str, torch.Tensor] = {}
    raw: dict[str, torch.Tensor] = {}
    for name, layer in s.layers.items():
        mat = layer.helper.grad_matrix(p.grads)
        if mat is not None:
            raw[name] = mat
            grads[name] = mat / scale if scale != 1.0 else mat
    return grads, raw


def flagged(p: StepOwner, s: LayerStructure, decompositions: Mapping[str, Decomposition], name: str, *,
            empty: bool = False) -> list[torch.Tensor]:
    """Factor ``name``'s decomposition with a validity flag (:mod:`kaisa_ds.decomposition.flagged`); ``empty``:
    the zeros a receiver hands to the broadcast."""
    f = s.factors()[name]
    device = s.device
    shape = {"diagonal": f.diagonal, "method": p.config.method, "dtype": p.config.inv_dtype_on(device),
             "device": device}
    if empty:
        return placeholder(f.dim, **shape)  # type: ignore[arg-type]
    return with_flag(decompositions.get(name), f.dim, **shape)  # type: ignore[arg-type]


def update_decompositions(p: StepOwner, s: LayerStructure) -> tuple[Decompositions, int]:
    """Decompose the factors this rank is assigned, then share them within worker groups: every decomposition in
    force afterwards (a factor whose decomposition failed keeps its previous one), and the bytes sent."""
    cfg = p.config
    mine = {name: (f.value, f.diagonal) for name, f in s.factors().items()
            if s.decomposes(name, p.rank) and f.has_value}
    fresh = decompose_all({n: (v, d) for n, (v, d) in mine.items() if v is not None}, method=p.grouped.method,
                          damping=cfg.damping_at(p.steps), compute_dtype=cfg.decomposition_dtype,  # type: ignore[arg-type]
                          out_dtype=cfg.inv_dtype_on(s.device), previous=p.decompositions)
    p.diagnostics.method_report = p.grouped.method.report()
    decs = {**p.decompositions, **{n: d for n, d in fresh.items() if d is not None}}
    sent = check_failures(p, s, tried=list(fresh), failed=[n for n, d in fresh.items() if d is None])
    local = {name: flagged(p, s, decs, name) for name in s.factors() if s.decomposes(name, p.rank)}
    received = s.comm.broadcast_decompositions(s.unit_factors, local, lambda n: flagged(p, s, decs, n, empty=True))
    if received:
        names = list(received)
        valid = torch.cat([received[n][-1].float() for n in names]).tolist()  # one host sync for all flags
        decs.update({n: from_tensors(received[n][:-1], method=cfg.method) for n, ok in zip(names, valid) if ok > 0})
    p.grouped.invalidate()
    p.diagnostics.record_refresh({f: (s.factor_labels[f], d.eigvals) for f, d in decs.items()
                                  if d.eigvals is not None and f in s.factor_labels})
    return decs, sent


def check_failures(p: StepOwner, s: LayerStructure, *, tried: list[str], failed: list[str]) -> int:
    """Count consecutive failures per factor; stop every rank alike once one factor exceeds the limit. The bytes
    sent to agree on it."""
    p.diagnostics.record_decompositions(p.steps, tried=tried, failed=failed)
    name, count = p.diagnostics.worst_failure()
    code = count * p.world + (p.world - 1 - p.rank)  # the longest run of failures, lowest rank on ties
    code = max_over_ranks(code, device=s.device)  # once per decomposition step: every rank takes the same decision
    sent = 8 if p.world > 1 else 0
    worst_count, worst_rank = code // p.world, p.world - 1 - code % p.world
    limit = p.config.max_decomposition_failures
    if worst_count > limit:
        where = name if worst_rank == p.rank else f"a factor decomposed on rank {worst_rank}"
        raise DecompositionFailed(
            f"K-FAC: the decomposition of {where} failed {worst_count} times in a row (FP32 and FP64; "
            f"max_decomposition_failures={limit}): its factor is not finite or not symmetric positive semi-definite. "
            "Raise damping, lower the learning rate, or skip the layer with skip_layers")
    return sent


def precondition_local(p: StepOwner, s: LayerStructure, grads: dict[str, torch.Tensor],
                       decs: Mapping[str, Decomposition]) -> dict[str, torch.Tensor]:
    """Precondition the layers this rank is a gradient worker for (unpreconditioned if no decomposition)."""
    pairs, out = {}, {}
    for name, layer in s.layers.items():
        if name not in grads or not s.preconditions(name, p.rank):
            continue
        a, g = decs.get(layer.a.name), decs.get(layer.g.name)
        if a is None or g is None:
            out[name] = grads[name]
        else:
            pairs[name] = (a, g)
    out.update(p.grouped.apply(grads, pairs, damping=p.config.damping_at(p.steps)))
    return out


def check_effectiveness(p: StepOwner, s: LayerStructure, grads: dict[str, torch.Tensor],
                        pre: dict[str, torch.Tensor], decs: Mapping[str, Decomposition]) -> None:
    """Measure (:mod:`kaisa_ds.precondition.effectiveness`), record in the diagnostics and warn (rank 0, once per
    kind of problem)."""
    damping = p.config.damping_at(p.steps)
    measured = {n for n, ly in s.layers.items()
                if s.preconditions(n, p.rank) and ly.a.name in decs and ly.g.name in decs}
    figures = effectiveness.measure(s.layers, grads, pre, measured=measured, damping=damping, world=p.world,
                                    shifts=p.grouped.shifts())
    empty = effectiveness.empty_layers(s.layers)
    warned = (effectiveness.warn(figures, empty=empty, damping=damping, warned=p.diagnostics.warned)
              if p.rank == 0 else set())
    p.diagnostics.record_effectiveness(figures, empty=empty, warned=warned)


def broadcast_gradients(p: StepOwner, s: LayerStructure, grads: dict[str, torch.Tensor],
                        pre: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Preconditioned gradients of every layer with a gradient, from their workers (MEM/HYBRID-OPT)."""
    unit_layers = {u: [n for n in names if n in grads] for u, names in s.unit_layers.items()}
    pre.update(s.comm.broadcast_gradients(unit_layers, pre, lambda n: [torch.empty_like(grads[n])]))
    return pre


def run_step(p: StepOwner) -> StepOutcome | None:
    """The whole K-FAC step (see the module docstring); None when called again without a new backward pass."""
    s = p.ensure_structure()  # raises before changing anything when no layer fired
    params = [ly.helper.weight for ly in s.layers.values()]
    if p.watermark.unchanged(p.grads, params):
        logger.warning("K-FAC: step() called again without a new backward pass: the gradients are already "
                       "preconditioned; nothing done (step %d)", p.steps)
        return None
    timer = p.timer
    timer.reset()
    timer.add("factor_capture", p.take_capture_seconds())
    step = p.steps
    grads, raw = read_grads(p, s)
    if not grads:
        raise RuntimeError("K-FAC: no preconditioned layer has a gradient; call loss.backward() before "
                           "precond.step() (the step counter and the statistics are unchanged)")
    outcome = StepOutcome()
    window: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    rows = p.statistic_rows
    with timer.stage("factor_reduction"):
        if step % p.config.value("factor_update_steps", step) == 0:
            if rows is None and (p.config.auto_interval or p.config.max_statistic_rows is not None):
                rows = outcome.statistic_rows = measure_rows(p, s)
            window, outcome.comm_bytes["factor_allreduce"] = reduce_window(p, s)
    decomposing = (step % p.config.inv_update_steps_at(step, rows=rows, cost=p.cost_interval) == 0
                   or p.needs_decomposition)
    checked = [t for pair in window.values() for t in pair if t is not None]
    norms = fp32_norms(checked + list(grads.values()))
    finite = torch.isfinite(norms).all()
    if p.noise.measuring:
        outcome.grad_sq = norms[len(checked):].square().sum()  # the check's norms: no extra pass over the gradients
    plain = not window and not decomposing  # a plain step waits for nothing: its check is read a step late
    if not plain and not bool(finite):  # a factor or decomposition step's one host sync before the write
        outcome.dropped = True
        return outcome
    decay = p.config.value("factor_decay", step)
    factors = s.factors()
    for name, (stat, stat_scale) in window.items():
        factors[name].commit(stat, decay, stat_scale)
    p.discard_window()
    decs = p.decompositions
    if decomposing:
        with timer.stage("decomposition"):
            decs, sent = update_decompositions(p, s)
        outcome.decompositions = decs
        if p.config.auto_interval and p.cost_interval is None and step > 0:
            outcome.cost_interval = time_interval(p, s, timer.seconds["decomposition"])
        if sent:
            outcome.comm_bytes["decomposition_broadcast"] = sent
    with timer.stage("preconditioning"):
        pre = precondition_local(p, s, grads, decs)
        if p.diagnostics.effectiveness_due:  # decomposition steps only: they sync anyway
            check_effectiveness(p, s, grads, pre, decs)
    with timer.stage("gradient_broadcast"):
        pre = broadcast_gradients(p, s, grads, pre)
    with timer.stage("kl_clip"):
        names = list(grads)  # after the broadcast every layer with a gradient has a preconditioned one
        grad_norms = norms[len(checked):]  # the check's norms of ``grads``, in order (a slice: no copy to the device)
        kl, lr = p.config.value("kl_clip", step), p.config.value("lr", step)
        sized = size_step([pre[n] for n in names], [grads[n] for n in names], grafting=Grafting(p.config.grafting),
                          lr=lr, kl_clip=kl, loss_scale=p.loss_scale(), grad_norms=grad_norms)
        damping = p.config.damping_at(step)
        p.diagnostics.record_step(kl_scale=sized.nu, damping=damping.value, lr=lr, damping_mode=damping.mode)
    with timer.stage("write_grads"):
        outs = sized.tensors()
        if plain:  # non-finite values: the gradients are written back as they came, and the window counted skipped
            outs = [torch.where(finite, out, raw[n]) for n, out in zip(names, outs)]
            outcome.finite = finite
        write_grads(p.grads, [part for n, out in zip(names, outs) for part in s.layers[n].helper.grad_parts(out)])
    p.watermark.record(p.grads, params)
    return outcome
