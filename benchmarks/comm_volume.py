"""Bytes each rank sends per K-FAC step under MEM-OPT, HYBRID-OPT and COMM-OPT, checked against KAISA's formulas.

Spawned gloo ranks train a BERT (``--size``) with K-FAC (factors every 2 steps, decompositions every 4) under
each strategy, with and without symmetry-aware packing. Every payload this rank hands to ``torch.distributed``
inside a K-FAC stage is intercepted and counted (a broadcast counts on its source rank only), and compared with
the core's own counters (``precond.comm_bytes``, the communicator's ``bytes_sent``). Three kinds of step:
``factor+decomp`` (step 4), ``factor`` (step 6: factors only) and ``other`` (step 5: cached decompositions only).

Formulas (computed by kaisa_ds.plan.traffic, the planner's own; payload per rank per step, FP32: 4 bytes an
element; W ranks, g = W·f gradient workers per layer; n a factor's size; |∇_l| = out·(in+1) a layer's gradient
matrix; the sums run over every distinct factor f and layer l):
  factor all-reduce, on factor steps, every rank:  4 · (Σ_f P_f + #factors)
      P_f = n² (n(n+1)/2 symmetry-aware; n for a diagonal factor), + one presence count per factor.
      A ring all-reduce puts about 2(W-1)/W of the payload on the wire per rank, whatever the strategy.
  decomposition broadcast, on decomposition steps:  mean over ranks 4 · Σ_f D_f / W when g > 1, else 0
      D_f = n² + n + 1 (eigenvectors, eigenvalues, validity flag); each factor's decomposing rank sends it once
      to the other g-1 members of its worker group, so a rank receives f·Σ D·(g-1)/g: ∝ (g-1)/g.
      Plus 8 bytes from every rank (W > 1): the all-reduce of the longest run of failed decompositions, so
      that every rank stops alike at ``max_decomposition_failures``.
  gradient broadcast, on every step:  mean over ranks 4 · f · Σ_l |∇_l| when g < W, else 0
      each of a layer's g workers sends it to its receiver group of W/g ranks, so a rank receives
      Σ|∇|·(1 - f): ∝ 1 - grad_worker_fraction (0 for COMM-OPT, the most for MEM-OPT).
Each rank's own payload is also checked exactly against the work assignment (which rank decomposes which
factor, which worker group holds which layer). Any disagreement beyond 1% exits with status 1.

    python -m benchmarks.comm_volume                   # worlds 2 and 4, BERT-tiny
    python -m benchmarks.comm_volume --worlds 2 --size mini
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.harness.batches import random_batch
from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.memory import MB
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from benchmarks.harness.options import STRATEGIES
from benchmarks.harness.output import table, write_json
from benchmarks.harness.processes import spawn
from kaisa_ds.distributed.assignment import resolve_grad_workers
from kaisa_ds.enums import DistributedStrategy
from kaisa_ds.plan.bert_sizes import KAISA_SKIP, SIZES
from kaisa_ds.plan.traffic import payload_per_rank, runs, wire_per_rank

STAGE_OF = {"factor_reduction": "factor_allreduce", "decomposition": "decomposition_broadcast",
            "gradient_broadcast": "gradient_broadcast"}
COUNTERS = tuple(STAGE_OF.values())
STEP_KINDS = {4: "factor+decomp", 5: "other", 6: "factor"}  # factor_update_steps=2, inv_update_steps=4
TOLERANCE = 0.01


class PayloadCounter:
    """Counts the bytes this rank hands to all_reduce/broadcast/all_gather while a K-FAC stage is open."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.stage: str | None = None
        self.sent = dict.fromkeys(COUNTERS, 0)
        self._originals = (dist.all_reduce, dist.broadcast)
        # the scale all-gather of half-precision factors; torch has two names for it (collectives use the newer)
        self._gathers = {n: getattr(dist, n) for n in ("all_gather_single", "all_gather_into_tensor")
                         if hasattr(dist, n)}

    def install(self) -> None:
        all_reduce, broadcast = self._originals

        def counted_all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self._add(tensor)
            return all_reduce(tensor, *args, **kwargs)

        def counted_broadcast(tensor: torch.Tensor, src: int, *args: Any, **kwargs: Any) -> Any:
            if src == self.rank:  # the global rank of the source
                self._add(tensor)
            return broadcast(tensor, src, *args, **kwargs)

        def counted(gather: Any) -> Any:
            def counted_all_gather(output: torch.Tensor, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                self._add(tensor)  # what this rank contributes
                return gather(output, tensor, *args, **kwargs)
            return counted_all_gather

        dist.all_reduce, dist.broadcast = counted_all_reduce, counted_broadcast  # type: ignore[assignment]
        for name, gather in self._gathers.items():
            setattr(dist, name, counted(gather))

    def uninstall(self) -> None:
        dist.all_reduce, dist.broadcast = self._originals  # type: ignore[assignment]
        for name, gather in self._gathers.items():
            setattr(dist, name, gather)

    def _add(self, tensor: torch.Tensor) -> None:
        if self.stage in STAGE_OF:
            self.sent[STAGE_OF[self.stage]] += tensor.numel() * tensor.element_size()

    def track(self, timer: Any) -> None:
        """Follow the preconditioner's stage timer to know which stage a collective belongs to."""
        original = timer.stage

        @contextlib.contextmanager
        def stage(name: str) -> Iterator[None]:
            self.stage = name
            try:
                with original(name):
                    yield
            finally:
                self.stage = None

        timer.stage = stage


def core_counters(kfac: Any) -> dict[str, int]:
    sent = kfac.structure.comm.bytes_sent if kfac.structure is not None else {}
    return {k: int(kfac.comm_bytes.get(k, 0)) + int(sent.get(k, 0)) for k in COUNTERS}


def _run_strategy(rank: int, world: int, strategy: DistributedStrategy, symmetric: bool, size: str) -> dict[str, Any]:
    from kaisa_ds import KFACPreconditioner

    model = bert_for_pretraining(size, vocab=1000, seq=32)
    kfac = KFACPreconditioner(model, factor_update_steps=2, inv_update_steps=4, grad_worker_fraction=strategy,
                              symmetry_aware=symmetric, skip_layers=KAISA_SKIP, kl_clip=0.001, lr=0.01)
    batch = random_batch(4, 32, 1000, "cpu", seed=rank)
    counter = PayloadCounter(rank)
    counter.track(kfac.timer)
    counter.install()
    per_step: dict[str, Any] = {}
    try:
        for step in range(max(STEP_KINDS) + 1):
            before_core, before_seen = core_counters(kfac), dict(counter.sent)
            model.zero_grad(set_to_none=True)
            pretraining_loss(model, batch).backward()
            for p in model.parameters():  # data-parallel gradient averaging (not K-FAC traffic: no stage open)
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
            kfac.step()
            if step in STEP_KINDS:
                after_core = core_counters(kfac)
                per_step[STEP_KINDS[step]] = {
                    "intercepted": {k: counter.sent[k] - before_seen[k] for k in COUNTERS},
                    "core": {k: after_core[k] - before_core[k] for k in COUNTERS}}
    finally:
        counter.uninstall()
        kfac.remove_hooks()
    assert kfac.structure is not None
    a = kfac.structure.assignment
    factors = {name: (f.dim, f.diagonal) for name, f in kfac.factors().items()}
    layers = {name: (ly.g.dim * ly.a.dim, ly.unit) for name, ly in kfac.layers.items()}
    return {"per_step": per_step, "factors": factors, "layers": layers, "grad_workers": a.grad_workers,
            "inverse_worker": dict(a.inverse_worker), "unit_group": dict(a.unit_group)}


def _measure_world(rank: int, world: int, size: str, strategies: list[str]) -> list[dict[str, Any]]:
    return [{"strategy": name, "symmetric": sym, **_run_strategy(rank, world, STRATEGIES[name], sym, size)}
            for name in strategies for sym in (False, True)]


@dataclass
class Formula:
    """Payload bytes per stage on a step where the stage runs: the mean over ranks, and each rank's exact share
    from the work assignment (kaisa_ds.plan.traffic's formulas, the planner's own)."""

    mean: dict[str, float]
    per_rank: dict[str, list[float]]


def formulas(info: dict[str, Any], *, world: int, symmetric: bool) -> Formula:
    """The formulas of the module docstring for one strategy's measured structure (factor sizes, layers)."""
    per_rank = payload_per_rank(factors=info["factors"], layers=info["layers"],
                                inverse_worker=info["inverse_worker"], unit_group=info["unit_group"], world=world,
                                grad_workers=info["grad_workers"], symmetric=symmetric)
    return Formula(mean={k: sum(v) / world for k, v in per_rank.items()}, per_rank=per_rank)


def expected(kind: str, stage: str, value: float) -> float:
    """A stage's payload on a kind of step: factors travel on factor steps, decompositions on decomp steps."""
    return value if runs(stage, factor_step=kind != "other", decomposition_step=kind == "factor+decomp") else 0.0


def compare(world: int, runs: list[list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per (strategy, packing, step kind) with measured vs formula per stage; the mismatches."""
    rows, problems = [], []
    for i, first in enumerate(runs[0]):
        ranks = [r[i] for r in runs]
        want = formulas(first, world=world, symmetric=first["symmetric"])
        for kind in STEP_KINDS.values():
            row: dict[str, Any] = {"world": world, "strategy": first["strategy"], "grad_workers": first["grad_workers"],
                                   "symmetric": first["symmetric"], "step": kind}
            wire = 0.0
            for stage in COUNTERS:
                seen = [r["per_step"][kind]["intercepted"][stage] for r in ranks]
                core = [r["per_step"][kind]["core"][stage] for r in ranks]
                mean_seen = sum(seen) / world
                formula = expected(kind, stage, want.mean[stage])
                exact = [expected(kind, stage, v) for v in want.per_rank[stage]]
                row[f"{stage} measured"] = mean_seen
                row[f"{stage} formula"] = formula
                wire += wire_per_rank(stage, mean_seen, world=world, g=first["grad_workers"])
                where = f"world {world} {first['strategy']} symmetric={first['symmetric']} {kind} {stage}"
                if abs(mean_seen - formula) > TOLERANCE * max(formula, 1.0):
                    problems.append(f"{where}: measured {mean_seen:.0f} B/rank, formula {formula:.0f}")
                bad = [r for r in range(world) if abs(seen[r] - exact[r]) > TOLERANCE * max(exact[r], 1.0)]
                if bad:
                    problems.append(f"{where}: ranks {bad} sent {[seen[r] for r in bad]} B, the assignment says "
                                    f"{[exact[r] for r in bad]}")
                if core != seen:
                    problems.append(f"{where}: the core's counters say {core} B, intercepted {seen} B")
            row["payload MB/rank"] = sum(row[f"{s} measured"] for s in COUNTERS) / MB
            row["wire MB/rank (est.)"] = wire / MB
            rows.append(row)
    return rows, problems


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("comm_volume", __doc__)
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="world sizes (default: %(default)s)")
    p.add_argument("--size", default="tiny", choices=[s for s in SIZES if s != "large"],
                   help="BERT size (default: %(default)s)")
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES),
                   help="default: all three")
    args = p.parse_args(argv)
    rows, problems = [], []
    skipped = []
    for world in args.worlds:
        if world < 2:
            p.error("--worlds: every world size must be at least 2")
        strategies, seen = [], set()
        for name in args.strategies:  # hybrid-opt has world // 2 gradient workers: MEM-OPT itself at world 2
            workers = resolve_grad_workers(STRATEGIES[name], world)
            if workers in seen:
                skipped.append(f"{name} at world {world} ({workers} gradient worker(s), as measured above)")
                continue
            seen.add(workers)
            strategies.append(name)
        world_rows, world_problems = compare(world, spawn(_measure_world, world, args.size, strategies))
        rows += world_rows
        problems += world_problems
    info = machine()
    short = {"factor_allreduce": "all-reduce", "decomposition_broadcast": "decomp bcast",
             "gradient_broadcast": "grad bcast"}
    printable = [{**r, **{f"{short[s]} {w}": r[f"{s} {w}"] / 2**10 for s in COUNTERS for w in ("measured", "formula")}}
                 for r in rows]
    print(f"K-FAC payload per rank per step (KiB; mean over ranks), BERT-{args.size}\n{machine_line(info)}\n")
    print(table(printable, ["world", "strategy", "grad_workers", "symmetric", "step"]
                + [f"{short[s]} {w}" for s in COUNTERS for w in ("measured", "formula")]
                + ["payload MB/rank", "wire MB/rank (est.)"]))
    if skipped:
        print("\nnot repeated (the same grid as a strategy above): " + "; ".join(skipped))
    write_json({"machine": info, "settings": {**vars(args), "out": str(args.out)}, "tolerance": TOLERANCE,
                "rows": rows, "skipped": skipped, "mismatches": problems}, args.out)
    print(f"\nwrote {args.out}")
    if problems:
        print("MISMATCHES between measured bytes and the formulas:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("every measured payload matches its formula (within 1%, per rank and on average)")
    return {"rows": rows, "mismatches": problems}


if __name__ == "__main__":
    main()
