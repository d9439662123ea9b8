"""K-FAC's decomposition interval as a finished phase recorded it, for the report: under ``inv_update_steps``
``"auto"`` the cost rule times the decompositions on the run's own steps, so two runs of one seed can choose
different intervals and then take different steps to the same loss (docs/math.md). The report names them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def interval_changes(rows: Iterable[dict[str, Any]]) -> list[tuple[int, int]]:
    """``(step, interval)`` at the first logged step and wherever the interval in force changed; empty for a phase
    without K-FAC (its rows carry no ``kfac`` snapshot)."""
    changes: list[tuple[int, int]] = []
    for row in rows:
        interval = (row.get("kfac") or {}).get("inv_update_steps")
        if isinstance(interval, int) and "step" in row and (not changes or changes[-1][1] != interval):
            changes.append((int(row["step"]), interval))
    return changes


def describe(label: str, changes: list[tuple[int, int]]) -> str | None:
    """One report line for a variant whose phase 1 ran K-FAC; None where it recorded no interval."""
    if not changes:
        return None
    steps = ", ".join(f"every {interval} steps from step {step}" for step, interval in changes)
    return (f"{label}'s phase-1 K-FAC decompositions: {steps}. With `inv_update_steps` \"auto\" the interval is "
            "timed on the run's own steps, so a rerun of this seed may choose another and take other steps; an "
            "integer `inv_update_steps` in the config pins it for exact reruns.")
