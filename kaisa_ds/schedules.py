"""Hyperparameter schedules: constants, callables, and KAISA's step-wise decay; the range each scheduled value must
stay in, checked whenever it is evaluated."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Scalar = float | int
ScheduleLike = Scalar | Callable[[int], Scalar]

# (lower, upper, lower inclusive) for each scheduled hyperparameter; checked whenever a value is evaluated.
SCHEDULED: dict[str, tuple[float, float, bool]] = {
    "damping": (0.0, math.inf, False),
    "relative_damping": (0.0, math.inf, False),
    "factor_decay": (0.0, 1.0, True),
    "kl_clip": (0.0, math.inf, False),
    "lr": (0.0, math.inf, True),
    "factor_update_steps": (1, math.inf, True),
    "inv_update_steps": (1, math.inf, True),
}
AUTO = "auto"  # ``inv_update_steps="auto"``: the interval the statistic rows per factor update set
# benchmarks/results/convergence/defaults_rule_3.md says how these were chosen (on the study's tune parts)
AUTO_ROWS_PER_DECOMPOSITION = 20_000  # new statistic rows a decomposition waits for
AUTO_INV_STEPS_RANGE = (10, 50)  # floor (decomposition cost) and ceiling (staleness) of the rows rule
DECOMPOSITION_BUDGET = 0.015  # the cost rule: decompositions take at most this share of a training step
COST_INV_STEPS_CEILING = 200  # the cost rule's longest interval (staleness: the basis is refreshed at least this often)
# the cost rule plans for rounds this much slower than the one it timed: one round is one sample, and the steady
# rounds of benchmarks/results/default_overhead.json (2026-12-02) ran ~10% slower than the calibration round, which
# put the decompositions at 1.67% of a step against a 1.5% budget
COST_MARGIN = 1.25
# the rounds the cost rule times before it sets the interval, from their median: one round is one sample, and one
# that ran fast froze an interval every later round overspent (default_overhead.json, 2026-12-03: 2.19% of a step)
COST_CALIBRATION_ROUNDS = 3
# the intervals the cost rule chooses from, rounded up to the next: rounds timed a few percent apart on reruns choose
# the same interval far more often than an interval to the step would (the rule times wall clock: an integer
# ``inv_update_steps`` pins it for exact reruns)
COST_LADDER = (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 75, 100, 150, 200)
_RANGE_TEXT = {
    "damping": "> 0", "relative_damping": "> 0", "factor_decay": "in [0, 1)", "kl_clip": "> 0 (or None to disable)",
    "lr": ">= 0",
    "factor_update_steps": "an integer >= 1", "inv_update_steps": "an integer >= 1",
}


def check_range(name: str, value: Scalar | None) -> Scalar | None:
    """Raise ValueError naming ``name`` and its allowed range when ``value`` is outside it."""
    if value is None and name in ("kl_clip", "damping", "relative_damping"):
        return None
    lo, hi, lo_incl = SCHEDULED[name]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and name.endswith("_steps"):
        ok = float(value).is_integer()  # type: ignore[arg-type]
    if ok:
        ok = (value >= lo if lo_incl else value > lo) and value < hi  # type: ignore[operator]
    if not ok:
        raise ValueError(f"{name}={value!r} is not valid; allowed: {_RANGE_TEXT[name]}")
    return value


@dataclass(frozen=True)
class StepSchedule:
    """``initial * factor ** (number of milestones <= step)``: the step-wise decay used by KAISA, for any scheduled
    :class:`~kaisa_ds.config.KFACConfig` option, e.g. ``damping=StepSchedule(0.003, milestones=(1000,), factor=0.5)``.
    Call it with a step to get the value.

    Args:
        initial: the value before the first milestone.
        milestones: the steps at which the value is multiplied by ``factor``.
        factor: the multiplier at each milestone.
        integer: round the value and keep it at least 1 (for update intervals such as ``inv_update_steps``).
    """

    initial: float
    milestones: tuple[int, ...] = field(default_factory=tuple)
    factor: float = 1.0
    integer: bool = False

    def __call__(self, step: int) -> Scalar:
        passed = sum(1 for m in self.milestones if step >= m)
        value = self.initial * self.factor**passed
        return max(1, round(value)) if self.integer else value

    def to_dict(self) -> dict[str, Any]:
        """The JSON form a DeepSpeed ``kfac`` section takes (``{"initial", "milestones", "factor"}``)."""
        return {"initial": self.initial, "milestones": list(self.milestones), "factor": self.factor}


def schedule_from_spec(spec: Any, *, name: str, integer: bool = False) -> ScheduleLike:
    """Build a schedule from a config value: a number, or ``{"initial", "milestones", "factor"}``."""
    if isinstance(spec, bool):
        raise ValueError(f"{name} must be a number or a schedule object, got a boolean")
    if isinstance(spec, (int, float)):
        if integer and not float(spec).is_integer():
            raise ValueError(f"{name}={spec!r} is not valid; allowed: an integer >= 1")
        return int(spec) if integer else float(spec)
    if isinstance(spec, dict):
        allowed = {"initial", "milestones", "factor"}
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ValueError(f"{name}: unknown schedule key(s) {unknown}; allowed keys: {sorted(allowed)}")
        if "initial" not in spec:
            raise ValueError(f"{name}: a schedule needs 'initial' (and optionally 'milestones', 'factor')")
        milestones: Sequence[Any] = spec.get("milestones", [])
        if not isinstance(milestones, (list, tuple)) or not all(
            isinstance(m, int) and not isinstance(m, bool) and m >= 0 for m in milestones
        ):
            raise ValueError(f"{name}.milestones must be a list of non-negative integer steps, got {milestones!r}")
        initial, factor = spec["initial"], spec.get("factor", 1.0)
        for key, val in (("initial", initial), ("factor", factor)):
            if isinstance(val, bool) or not isinstance(val, (int, float)) or val <= 0:
                raise ValueError(f"{name}.{key} must be a positive number, got {val!r}")
        if integer and not float(initial).is_integer():
            raise ValueError(f"{name}.initial={initial!r} is not valid; allowed: an integer >= 1")
        return StepSchedule(float(initial), tuple(sorted(milestones)), float(factor), integer)
    raise ValueError(
        f"{name} must be a number or a schedule object {{'initial', 'milestones', 'factor'}}, got {spec!r}"
    )


def cost_inv_update_steps(*, decomposition_seconds: float, step_seconds: float, budget: float,
                          factor_update_steps: int) -> int:
    """The cost rule of the ``"auto"`` interval: the fewest steps between decompositions for one decomposition
    round (``decomposition_seconds``, planned :data:`COST_MARGIN` slower) to cost at most ``budget`` of the steps in
    between (``step_seconds`` each), rounded up to a rung of :data:`COST_LADDER` and to a multiple of
    ``factor_update_steps``, at most :data:`COST_INV_STEPS_CEILING`."""
    steps = math.ceil(COST_MARGIN * decomposition_seconds / max(budget * step_seconds, 1e-12))
    steps = next((rung for rung in COST_LADDER if rung >= steps), COST_INV_STEPS_CEILING)
    steps = factor_update_steps * math.ceil(max(steps, 1) / factor_update_steps)
    return max(factor_update_steps, min(steps, COST_INV_STEPS_CEILING))


def auto_inv_update_steps(*, rows: int | None, factor_update_steps: int, cost: int | None = None) -> int:
    """The ``"auto"`` decomposition interval: enough factor updates that a decomposition follows about
    :data:`AUTO_ROWS_PER_DECOMPOSITION` new statistic rows (``rows`` per update, over every rank), within
    :data:`AUTO_INV_STEPS_RANGE` and never below ``factor_update_steps``. A small batch's factors are noisy, so its
    decompositions wait longer; a large batch's are refreshed sooner, while the model is still moving. ``rows``
    None (not known yet): the ceiling.

    Once the cost rule has measured the decompositions (``cost``, :func:`cost_inv_update_steps`), the interval is
    the longer of the two: decompositions never cost more than their budget of a step.

    Args:
        rows: statistic rows (tokens × accumulated passes × ranks, after sampling) one factor update takes in.
        factor_update_steps: steps between factor updates.
        cost: the cost rule's interval, once measured (None: not yet).
    """
    low, high = AUTO_INV_STEPS_RANGE
    if rows is None or rows <= 0:
        by_rows = max(high, factor_update_steps)
    else:
        updates = max(1, round(AUTO_ROWS_PER_DECOMPOSITION / rows))
        by_rows = max(factor_update_steps, min(high, max(low, factor_update_steps * updates)))
    return by_rows if cost is None else max(by_rows, cost)


def section_values(section: Mapping[str, Any], *, keys: set[str]) -> dict[str, Any]:
    """A DeepSpeed ``kfac`` section's values as KFACConfig takes them: only ``keys``, schedules built from their
    JSON specs, ``skip_layers`` patterns; errors name ``kfac.<key>``."""
    unknown = sorted(set(section) - keys)
    if unknown:
        raise ValueError(f"kfac: unknown key(s) {unknown}; allowed keys: {sorted(keys | {'enabled'})}")
    values: dict[str, Any] = {}
    for key, val in section.items():
        if key in ("damping", "relative_damping", "factor_decay", "kl_clip", "lr") and val not in (None, AUTO):
            val = schedule_from_spec(val, name=f"kfac.{key}")
        elif key == "factor_update_steps" or (key == "inv_update_steps" and not isinstance(val, str)):
            val = schedule_from_spec(val, name=f"kfac.{key}", integer=True)  # a word: "auto", or the field says why
        elif key == "skip_layers" and not isinstance(val, str) and not (
                isinstance(val, list) and all(isinstance(v, str) for v in val)):
            raise ValueError(f"kfac.skip_layers must be a list of regular expressions, got {val!r}")
        values[key] = val
    return values


def evaluate(value: ScheduleLike | None, step: int) -> Scalar | None:
    """The value of a constant-or-callable hyperparameter at ``step``."""
    if value is None:
        return None
    return value(step) if callable(value) else value
