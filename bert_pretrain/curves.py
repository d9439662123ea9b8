"""Held-out loss curves from a run's metrics.jsonl, against steps and training seconds, and when they cross a target.

One home for "how long did this run need to reach loss X": the convergence benchmark and the main job's report
both read curves here. Training seconds are the ``elapsed_s`` column (the sum of optimizer-step times, without
evaluation or checkpoint saving), so time-to-target counts training only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaisa_ds.report.metrics_log import read_rows

logger = logging.getLogger(__name__)


def resumed_elapsed(path: Path, step: int) -> float:
    """Training seconds a resumed run had already spent: the ``elapsed_s`` of its row ``step`` (0 if none)."""
    if step <= 0:
        return 0.0
    row: dict[str, Any] = next((r for r in reversed(read_rows(path)) if r.get("step") == step), {})
    return float(row.get("elapsed_s", 0.0))


@dataclass(frozen=True)
class Curve:
    """Evaluation points of one held-out metric: optimizer steps, training seconds at those steps, values."""

    steps: list[float]
    seconds: list[float]
    values: list[float]

    @property
    def final(self) -> float | None:
        return self.values[-1] if self.values else None


def heldout_curve(rows: list[dict[str, Any]], *, column: str = "heldout_mlm_loss") -> Curve:
    """The evaluated rows' ``column`` against step and ``elapsed_s`` (rows without ``elapsed_s``: NaN seconds)."""
    points = [r for r in rows if column in r and "step" in r]
    return Curve(steps=[float(r["step"]) for r in points],
                 seconds=[float(r.get("elapsed_s", float("nan"))) for r in points],
                 values=[float(r[column]) for r in points])


def training_curve(rows: list[dict[str, Any]], *, at: list[float], column: str = "mlm_loss") -> Curve:
    """The training ``column`` averaged over each window between evaluation steps ``at`` (the steps in
    ``(previous, this]``), so it sits beside the held-out curve at the same points: one batch's loss is too noisy to
    compare. The logged loss is taken with dropout on, so it also carries what dropout costs each model; an
    overfitting check reads a dropout-off evaluation of the training text beside it. A window with no training rows
    gets NaN."""
    trained = [r for r in rows if column in r and "step" in r]
    values, seconds, previous = [], [], float("-inf")
    for step in at:
        window = [r for r in trained if previous < float(r["step"]) <= step]
        values.append(sum(float(r[column]) for r in window) / len(window) if window else float("nan"))
        seconds.append(float(window[-1].get("elapsed_s", float("nan"))) if window else float("nan"))
        previous = step
    return Curve(steps=list(at), seconds=seconds, values=values)


@dataclass(frozen=True)
class Crossing:
    step: float
    seconds: float


def first_crossing(curve: Curve, target: float) -> Crossing | None:
    """Where the curve first reaches ``target`` or below, linearly interpolated between the two evaluations around
    it (in steps and in seconds alike); the first point itself if it is already there; None if never reached."""
    for i, value in enumerate(curve.values):
        if value > target:
            continue
        if i == 0:
            return Crossing(curve.steps[0], curve.seconds[0])
        prev = curve.values[i - 1]
        frac = (prev - target) / (prev - value)  # prev > target >= value, so 0 < frac <= 1
        return Crossing(step=curve.steps[i - 1] + frac * (curve.steps[i] - curve.steps[i - 1]),
                        seconds=curve.seconds[i - 1] + frac * (curve.seconds[i] - curve.seconds[i - 1]))
    return None


def best_point(curve: Curve) -> Crossing | None:
    """Where the curve first has its lowest value: the steps and training seconds a run needed to reach its own best.
    Time to a baseline's best counts against this, not against the baseline's whole run: a baseline whose loss rises
    late is one that should have stopped there, and measured against its whole run a copy of it would 'win'."""
    if not curve.values:
        return None
    i = curve.values.index(min(curve.values))
    return Crossing(step=curve.steps[i], seconds=curve.seconds[i])
