"""The one ``amortise`` gives each former caller exactly its former figures: step_cost's (with the overhead over a
baseline step and the stage-only estimate) and versus_kfac_pytorch's (components and total only)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from benchmarks.harness.interval import Interval, amortise
from benchmarks.step_cost.measure import COMPONENTS as STEP_COST_COMPONENTS
from benchmarks.versus_kfac_pytorch.settings import COMPONENTS as VERSUS_COMPONENTS


# The two implementations before issue 24, verbatim but for their names and component lists passed in: the
# references the unified function must reproduce bit for bit.
def _step_cost_before(kinds: dict[str, dict[str, float]], interval: Interval, baseline_step: float,
                      components: tuple[str, ...]) -> dict[str, Any]:
    counts = interval.counts()
    per_step = {c: sum(n * kinds[k][c] for k, n in counts.items()) / interval.inv_every for c in components}
    total = sum(n * kinds[k]["kfac_total"] for k, n in counts.items()) / interval.inv_every
    stages = sum(n * (kinds[k]["factor_capture"] + kinds[k]["precond_step"])
                 for k, n in counts.items()) / interval.inv_every
    return {"counts": counts, "seconds_per_step": total, "overhead": total / baseline_step,
            "components_seconds_per_step": per_step, "stage_seconds_per_step": stages,
            "stage_overhead": stages / baseline_step}


def _versus_before(kinds: dict[str, dict[str, float]], interval: Interval,
                   components: tuple[str, ...]) -> dict[str, Any]:
    counts = interval.counts()
    per_step = {c: sum(n * kinds[k][c] for k, n in counts.items()) / interval.inv_every for c in components}
    total = sum(n * kinds[k]["kfac_total"] for k, n in counts.items()) / interval.inv_every
    return {"counts": counts, "seconds_per_step": total, "components_seconds_per_step": per_step}


def _kinds(interval: Interval, columns: set[str], seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)  # awkward floats, negative ones too (noise makes differences negative)
    return {k: {c: rng.uniform(-0.05, 3.0) for c in sorted(columns)} for k in interval.counts()}


@pytest.mark.parametrize(("factor_every", "inv_every"), [(5, 50), (1, 10), (10, 10), (2, 4), (3, 300)])
def test_amortise_gives_each_former_callers_figures_exactly(factor_every: int, inv_every: int) -> None:
    interval = Interval(factor_every, inv_every)
    columns = {*STEP_COST_COMPONENTS, *VERSUS_COMPONENTS, "kfac_total", "precond_step"}
    for seed in range(3):
        kinds = _kinds(interval, columns, seed)
        new = amortise(kinds, interval, components=STEP_COST_COMPONENTS, baseline_step=1.7 + seed)
        old = _step_cost_before(kinds, interval, 1.7 + seed, STEP_COST_COMPONENTS)
        assert new == old  # exact: the recorded figures' arithmetic is unchanged
        assert list(new) == list(old) and list(new["components_seconds_per_step"]) == list(STEP_COST_COMPONENTS)
        new = amortise(kinds, interval, components=VERSUS_COMPONENTS)
        old = _versus_before(kinds, interval, VERSUS_COMPONENTS)
        assert new == old and list(new) == list(old)
