"""Hyperparameter schedules: constants, callables, and KAISA's step-wise decay."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Scalar = float | int
ScheduleLike = Scalar | Callable[[int], Scalar]


@dataclass(frozen=True)
class StepSchedule:
    """``initial * factor ** (number of milestones <= step)``: the step-wise decay used by KAISA.

    For damping, e.g. ``StepSchedule(0.003, milestones=(1000,), factor=0.5)``; for update
    intervals (integers) the value is rounded and at least 1.
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


def evaluate(value: ScheduleLike | None, step: int) -> Scalar | None:
    """The value of a constant-or-callable hyperparameter at ``step``."""
    if value is None:
        return None
    return value(step) if callable(value) else value
