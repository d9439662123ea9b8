"""Bytes each rank hands to each K-FAC collective, per kind of step: KAISA's communication formulas.

Payload per rank on a step where the stage runs (W ranks, g gradient workers per layer, n a factor's size,
|∇_l| = out·(in+1) a layer's gradient matrix):
  factor all-reduce, on factor steps, every rank: ``s·Σ_f P_f + 4·#factors``
      ``P_f`` = n² (n(n+1)/2 symmetry-aware; n for a diagonal factor), in the statistics' dtype (``s`` bytes),
      plus one FP32 presence count per factor. A ring all-reduce puts about 2(W-1)/W of it on the wire.
  decomposition broadcast, on decomposition steps (g > 1): what the rank decomposes, ``D_f`` elements in
      ``inv_dtype`` (eigen: n² + n, inverse: n²; diagonal: n) plus a validity flag, sent once to the other
      g-1 members of its worker group; plus 8 bytes from every rank (W > 1): the all-reduce of the longest run
      of failed decompositions, so every rank stops alike at ``max_decomposition_failures``.
  gradient broadcast, every step (g < W): the FP32 preconditioned gradients of the layers of the rank's
      worker group, sent to its receiver group of W/g ranks.
``benchmarks.comm_volume`` measures these on real ranks and checks them with these functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kaisa_ds.config import KFACConfig
from kaisa_ds.enums import ComputeMethod
from kaisa_ds.plan.memory import decomposition_numel

STAGES = ("factor_allreduce", "decomposition_broadcast", "gradient_broadcast")
FAILURE_CHECK_BYTES = 8  # one int64 all-reduced per decomposition step (kaisa_ds.step.check_failures)
PRESENCE_BYTES = 4  # the FP32 count of contributing ranks per factor, reduced with the statistics
GRADIENT_BYTES = 4  # preconditioned gradients travel in FP32


def statistics_dtype(config: KFACConfig) -> torch.dtype:
    """The dtype factor statistics are all-reduced in: FP16/BF16 factors travel in their storage dtype (with a
    per-factor FP32 scale, whose all-gather takes the place of FP32 statistics' presence flags), others in FP32."""
    dtype = config.storage_dtype
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def statistics_packed(config: KFACConfig) -> bool:
    """Whether statistics travel as upper triangles: with ``symmetry_aware``, and always in half precision."""
    return config.symmetry_aware or statistics_dtype(config) != torch.float32


def factor_payload(n: int, diagonal: bool, *, symmetric: bool) -> int:
    """Elements of one factor's statistics in the all-reduce."""
    return n if diagonal else (n * (n + 1) // 2 if symmetric else n * n)


def decomposition_payload(n: int, diagonal: bool, *, method: ComputeMethod = ComputeMethod.EIGEN) -> int:
    """Elements of one factor's decomposition broadcast: its tensors and the validity flag."""
    return decomposition_numel(n, diagonal, method=method) + 1


def payload_per_rank(*, factors: Mapping[str, tuple[int, bool]], layers: Mapping[str, tuple[int, str]],
                     inverse_worker: Mapping[str, int], unit_group: Mapping[str, int], world: int,
                     grad_workers: int, symmetric: bool, method: ComputeMethod = ComputeMethod.EIGEN,
                     stat_bytes: int = 4,
                     inv_bytes: int = 4) -> dict[str, list[float]]:
    """Each rank's payload per stage on a step where that stage runs (see the module docstring).

    ``factors``: name -> (size, diagonal); ``layers``: name -> (gradient elements, work unit).
    """
    g = grad_workers
    if world == 1:
        return {s: [0.0] for s in STAGES}
    allreduce = float(stat_bytes * sum(factor_payload(n, d, symmetric=symmetric) for n, d in factors.values())
                      + PRESENCE_BYTES * len(factors))
    decomposed: list[float] = [0.0] * world
    if g > 1:
        for f, r in inverse_worker.items():
            decomposed[r] += inv_bytes * decomposition_payload(*factors[f], method=method)
    grads: list[float] = [0.0] * world
    if g < world:
        by_group: dict[int, float] = {}
        for size, unit in layers.values():
            by_group[unit_group[unit]] = by_group.get(unit_group[unit], 0.0) + GRADIENT_BYTES * size
        grads = [by_group.get(r // g, 0.0) for r in range(world)]
    return {"factor_allreduce": [allreduce] * world,
            "decomposition_broadcast": [d + FAILURE_CHECK_BYTES for d in decomposed],
            "gradient_broadcast": grads}


def runs(stage: str, *, factor_step: bool, decomposition_step: bool) -> bool:
    """Whether ``stage`` communicates on a step of this kind."""
    if stage == "factor_allreduce":
        return factor_step
    if stage == "decomposition_broadcast":
        return decomposition_step
    return True


@dataclass(frozen=True)
class StepKind:
    name: str
    factor_step: bool
    decomposition_step: bool


STEP_KINDS = (StepKind("plain", False, False), StepKind("factor", True, False),
              StepKind("decomposition", True, True), StepKind("decomposition_only", False, True))


def step_counts(factor_every: int, inv_every: int) -> tuple[int, dict[str, int]]:
    """One period of the schedule (lcm of the intervals) and how many steps of each kind it holds."""
    period = math.lcm(factor_every, inv_every)
    counts = dict.fromkeys((k.name for k in STEP_KINDS), 0)
    for step in range(period):
        f, d = step % factor_every == 0, step % inv_every == 0
        kind = next(k for k in STEP_KINDS if (k.factor_step, k.decomposition_step) == (f, d))
        counts[kind.name] += 1
    return period, {k: n for k, n in counts.items() if n}


def wire_per_rank(stage: str, mean_payload: float, *, world: int, g: int) -> float:
    """Bytes a rank puts on the wire on average: ring all-reduce 2(W-1)/W of the payload; a broadcast
    reaches (group size - 1) receivers."""
    fanout = {"factor_allreduce": 2 * (world - 1) / world, "decomposition_broadcast": g - 1,
              "gradient_broadcast": world // g - 1}[stage]
    return mean_payload * fanout
