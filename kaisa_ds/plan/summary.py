"""One plan: memory, traffic by step kind, decomposition balance and (with rates) the predicted overhead of a
K-FAC run, as a JSON-ready dict. The CLI prints it; ``benchmarks.scale_sim`` tabulates it across worlds."""

from __future__ import annotations

from typing import Any

from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.registry import method_for
from kaisa_ds.distributed.assignment import Assignment, resolve_grad_workers
from kaisa_ds.factors.sampling import capped_fraction, kept_passes, kept_rows
from kaisa_ds.plan.balance import assign, balance
from kaisa_ds.plan.memory import element_size, memory_per_rank, planned_inv_dtype, planned_method
from kaisa_ds.plan.overhead import Rates
from kaisa_ds.plan.shapes import ModelShapes
from kaisa_ds.plan.traffic import (
    STAGES,
    STEP_KINDS,
    payload_per_rank,
    runs,
    statistics_dtype,
    statistics_packed,
    step_counts,
)
from kaisa_ds.schedules import cost_inv_update_steps

MEMORY_PARTS = ("factors", "window", "decompositions", "denominators")


def strategy_name(world: int, grad_workers: int) -> str:
    if world == 1:
        return "single"
    return "COMM-OPT" if grad_workers == world else "MEM-OPT" if grad_workers == 1 else "HYBRID-OPT"


def _max_mean(values: list[float]) -> dict[str, float]:
    return {"max": max(values), "mean": sum(values) / len(values)}


def traffic(shapes: ModelShapes, a: Assignment, config: KFACConfig, *, inv_every: int,
            cpu_ranks: bool = False) -> dict[str, Any]:
    """Payload bytes per rank (GPUs, or CPU ranks) of each collective on each kind of step, and amortised over one
    period."""
    per_rank = payload_per_rank(
        factors={n: (f.dim, f.diagonal) for n, f in shapes.factors.items()},
        layers={n: (ly.grad_numel, ly.unit) for n, ly in shapes.layers.items()},
        inverse_worker=a.inverse_worker, unit_group=a.unit_group, world=a.world, grad_workers=a.grad_workers,
        symmetric=statistics_packed(config), method=config.method,
        stat_bytes=element_size(statistics_dtype(config)),
        inv_bytes=element_size(planned_inv_dtype(config, cpu_ranks=cpu_ranks)))
    period, counts = step_counts(config.value("factor_update_steps", 0), inv_every)
    kinds = {k.name: k for k in STEP_KINDS if k.name in counts}
    by_kind: dict[str, dict[str, dict[str, float]]] = {}
    for name, kind in kinds.items():
        on = {s: runs(s, factor_step=kind.factor_step, decomposition_step=kind.decomposition_step) for s in STAGES}
        by_kind[name] = {s: _max_mean([v if on[s] else 0.0 for v in per_rank[s]]) for s in STAGES}
        by_kind[name]["total"] = _max_mean([sum(per_rank[s][r] for s in STAGES if on[s]) for r in range(a.world)])
    amortised = {s: _max_mean([sum(counts[k] * (per_rank[s][r] if runs(s, factor_step=kinds[k].factor_step,
                                                                         decomposition_step=kinds[k].decomposition_step)
                                                 else 0.0) for k in kinds) / period for r in range(a.world)])
                 for s in STAGES}
    amortised["total"] = {"max": sum(v["max"] for v in amortised.values()),  # an upper bound: ranks differ
                          "mean": sum(v["mean"] for v in amortised.values())}
    return {"period_steps": period, "step_counts": counts, "payload_bytes_per_rank": by_kind,
            "amortised_bytes_per_rank": amortised}


def overhead(shapes: ModelShapes, a: Assignment, config: KFACConfig, rates: Rates, *, tokens: int, passes: int,
             traffic_plan: dict[str, Any], baseline_flops: float | None, cpu_ranks: bool = False) -> dict[str, Any]:
    """Predicted K-FAC seconds per kind of step and amortised; as a share of the baseline step when known."""
    stats_passes = kept_passes(config.factor_pass_fraction, passes)  # the pass subset that feeds the factors
    fraction = capped_fraction(config.factor_sample_fraction, max_rows=config.max_statistic_rows,
                               rows_taken=tokens * config.factor_sample_fraction * stats_passes * a.world)
    rows = tokens * fraction  # per rank and pass: the cap samples every rank's rows down alike
    stats_flops = stats_passes * sum(rows if f.diagonal else 2 * rows * f.dim * f.dim for f in shapes.factors.values())
    per_flop = method_for(planned_method(config, cpu_ranks=cpu_ranks)).matmuls_per_step
    precondition = [0.0] * a.world
    for ly in shapes.layers.values():
        for r in a.worker_group(a.unit_group[ly.unit]):
            precondition[r] += per_flop * ly.out * ly.inp * (ly.out + ly.inp)
    parts = {"statistics": rates.gemm_seconds(stats_flops),
             "decomposition": round_seconds(shapes, a, config, rates, cpu_ranks=cpu_ranks),
             "preconditioning": rates.gemm_seconds(max(precondition))}
    payload = traffic_plan["payload_bytes_per_rank"]
    seconds: dict[str, dict[str, float]] = {}
    for name, kind in ((k.name, k) for k in STEP_KINDS if k.name in traffic_plan["step_counts"]):
        s = {"statistics": parts["statistics"] if kind.factor_step else 0.0,
             "decomposition": parts["decomposition"] if kind.decomposition_step else 0.0,
             "preconditioning": parts["preconditioning"],
             "communication": rates.wire_seconds(payload[name]["total"]["max"])}
        s["total"] = sum(s.values())
        seconds[name] = s
    period, counts = traffic_plan["period_steps"], traffic_plan["step_counts"]
    amortised = sum(counts[k] * seconds[k]["total"] for k in seconds) / period
    baseline = rates.baseline_seconds(baseline_flops)
    return {"seconds_per_step_kind": seconds, "amortised_seconds": amortised,
            "baseline_step_seconds": baseline,
            "baseline_source": "measured (--step-seconds or calibration)" if rates.step_seconds is not None
            else "estimated from model FLOPs at the GEMM rate" if baseline else None,
            "amortised_overhead": amortised / baseline if baseline else None,
            "communication_counted": rates.network_gbps is not None}


def round_seconds(shapes: ModelShapes, a: Assignment, config: KFACConfig, rates: Rates, *, cpu_ranks: bool) -> float:
    """One decomposition round on the busiest rank (every rank waits for it at the broadcasts), by the method that
    runs on the planned ranks."""
    method = planned_method(config, cpu_ranks=cpu_ranks)
    per_rank = [0.0] * a.world
    for name, r in a.inverse_worker.items():
        f = shapes.factors[name]
        per_rank[r] += rates.decomposition_seconds(f.dim, diagonal=f.diagonal, method=method)
    return max(per_rank)


def predicted_cost_interval(shapes: ModelShapes, a: Assignment, config: KFACConfig, rates: Rates | None,
                            baseline_flops: float | None, *, cpu_ranks: bool) -> int | None:
    """The interval the ``"auto"`` cost rule would set, from the rates (None: no rates or no baseline step)."""
    if rates is None or not config.auto_interval:
        return None
    baseline = rates.baseline_seconds(baseline_flops)
    if not baseline:
        return None
    return cost_inv_update_steps(decomposition_seconds=round_seconds(shapes, a, config, rates, cpu_ranks=cpu_ranks),
                                 step_seconds=baseline,
                                 budget=config.decomposition_budget,
                                 factor_update_steps=config.value("factor_update_steps", 0))


def make_plan(shapes: ModelShapes, config: KFACConfig, *, world: int, micro_batch: int, seq: int, passes: int = 1,
              rates: Rates | None = None, baseline_flops: float | None = None,
              cpu_ranks: bool = False) -> dict[str, Any]:
    """Everything the planner reports for one configuration (see the module docstring); ``cpu_ranks``: plan CPU
    ranks, where ``grad_worker_fraction="auto"`` is MEM-OPT (on GPUs: COMM-OPT)."""
    g = resolve_grad_workers(config.grad_worker_fraction, world, cpu_ranks=cpu_ranks)  # type: ignore[arg-type]
    a = assign(shapes, world=world, grad_workers=g)
    mem = memory_per_rank(shapes, a, config, cpu_ranks=cpu_ranks)
    worst = max(mem, key=lambda m: m.total)
    bal = balance(shapes, a)
    # statistic rows per factor update over every rank, as the sampler keeps them
    rows = kept_rows(config.factor_sample_fraction, micro_batch * seq) * kept_passes(config.factor_pass_fraction,
                                                                                     passes) * world
    cost = predicted_cost_interval(shapes, a, config, rates, baseline_flops, cpu_ranks=cpu_ranks)
    inv_every = config.inv_update_steps_at(0, rows=rows, cost=cost)
    plan_traffic = traffic(shapes, a, config, inv_every=inv_every, cpu_ranks=cpu_ranks)
    return {
        "world": world, "grad_workers": g, "strategy": strategy_name(world, g),
        "layers": len(shapes.layers), "factors": len(shapes.factors), "micro_batch": micro_batch, "seq": seq,
        "passes": passes, "factor_update_steps": config.value("factor_update_steps", 0),
        "inv_update_steps": inv_every, "inv_update_steps_auto": config.auto_interval, "statistic_rows": rows,
        "inv_update_steps_cost_rule": cost,
        "memory_bytes_per_rank": worst.total,
        "memory_bytes": {"max_rank": {p: getattr(worst, p) for p in MEMORY_PARTS},
                         "mean": {p: sum(getattr(m, p) for m in mem) / world for p in MEMORY_PARTS},
                         "per_rank_total": [m.total for m in mem]},
        "traffic": plan_traffic,
        "decomposition_work_per_rank": {"max": max(bal.per_rank), "mean": bal.mean, "largest_single": bal.largest,
                                        "unit": "n^3 of a dense factor (the assignment's cost model)"},
        "decomposition_imbalance": bal.imbalance, "decomposition_imbalance_bound": bal.bound,
        "overhead": None if rates is None else overhead(
            shapes, a, config, rates, tokens=micro_batch * seq, passes=passes, traffic_plan=plan_traffic,
            baseline_flops=baseline_flops, cpu_ranks=cpu_ranks),
    }
