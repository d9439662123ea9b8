"""Wall time of one call, through kaisa_ds's own stage timer (the home of step timing), and the median."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from kaisa_ds.timing import StageTimer


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def timed(fn: Callable[[], Any], *, cuda: bool) -> float:
    """Wall seconds of one call; on a GPU (``cuda``) the queue is drained before and after, as K-FAC's stages are."""
    timer = StageTimer()
    timer.sync = cuda
    with timer.stage("call"):
        fn()
    return timer.seconds["call"]
