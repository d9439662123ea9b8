"""One decomposition interval of K-FAC steps and the exact interval average (amortisation) of per-kind costs.

In an interval of ``inv_every`` steps with factors every ``factor_every`` steps there are three kinds of step:
decomposition (1), factor (inv/factor - 1) and plain (the rest). A benchmark measures each kind for real and
averages over the interval from those counts, so nothing is extrapolated from a shortened interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

Kinds = Mapping[str, Mapping[str, float]]  # per kind of step: its figures (seconds) by name


@dataclass(frozen=True)
class Interval:
    """One decomposition interval: which kinds of step it holds, how many of each, and a step number of each."""

    factor_every: int
    inv_every: int

    def __post_init__(self) -> None:
        if self.factor_every < 1 or self.inv_every < 1 or self.inv_every % self.factor_every:
            raise ValueError(f"--inv-every ({self.inv_every}) must be a positive multiple of --factor-every "
                             f"({self.factor_every})")

    def counts(self) -> dict[str, int]:
        factor_steps = self.inv_every // self.factor_every
        counts = {"decomposition": 1, "factor": factor_steps - 1, "plain": self.inv_every - factor_steps}
        return {kind: n for kind, n in counts.items() if n > 0}

    def step_number(self, kind: str) -> int:
        return {"decomposition": self.inv_every, "factor": self.factor_every, "plain": 1}[kind]


def interval_mean(kinds: Kinds, interval: Interval, value: Callable[[Mapping[str, float]], float]) -> float:
    """The interval average of ``value`` of each kind's figures: each kind weighted by its count per interval."""
    return sum(n * value(kinds[k]) for k, n in interval.counts().items()) / interval.inv_every


def amortise(kinds: Kinds, interval: Interval, *, components: Sequence[str],
             baseline_step: float | None = None) -> dict[str, Any]:
    """Interval average of the K-FAC time (each kind's ``kfac_total``) and of each of ``components``.

    With ``baseline_step`` (seconds of a step without K-FAC) also the overhead over it, and the same from K-FAC's
    own timed work only (hook callbacks + ``precond.step()``, each kind's ``factor_capture + precond_step``): no
    difference of two forward+backward timings, so machine load moves it far less, but the hooks' bookkeeping
    outside the callbacks is left out."""
    counts = interval.counts()
    per_step = {c: interval_mean(kinds, interval, itemgetter(c)) for c in components}
    total = interval_mean(kinds, interval, itemgetter("kfac_total"))
    if baseline_step is None:
        return {"counts": counts, "seconds_per_step": total, "components_seconds_per_step": per_step}
    stages = interval_mean(kinds, interval, lambda row: row["factor_capture"] + row["precond_step"])
    return {"counts": counts, "seconds_per_step": total, "overhead": total / baseline_step,
            "components_seconds_per_step": per_step, "stage_seconds_per_step": stages,
            "stage_overhead": stages / baseline_step}
