"""Per-stage wall-clock timings of one K-FAC step (optionally synchronising the device first)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class StageTimer:
    """Accumulates seconds per stage name; ``sync=True`` makes GPU timings exact at the cost of a sync."""

    def __init__(self) -> None:
        self.sync = False
        self.seconds: dict[str, float] = {}

    def reset(self) -> None:
        self.seconds = {}

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            self.add(name, time.perf_counter() - start)
