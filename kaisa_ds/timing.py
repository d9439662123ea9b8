"""Per-stage wall-clock timings of one K-FAC step (optionally synchronising the device first), and the clock of the
training steps around K-FAC's (the cost-aware decomposition interval)."""

from __future__ import annotations

import itertools
import statistics
import time
import weakref
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

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


class StepClock:
    """Marks the start of every K-FAC step, so the training step between two marks (forward, backward, K-FAC,
    optimizer) can be timed without a host sync: wall clock on the CPU, CUDA events on a GPU, read later (at a
    decomposition step, which synchronises anyway)."""

    def __init__(self, *, keep: int = 64) -> None:
        self._marks: deque[tuple[float | torch.cuda.Event, bool]] = deque(maxlen=keep)
        self._rounds: list[float] = []

    def add_round(self, seconds: float) -> None:
        """A decomposition round's seconds, for the cost rule."""
        self._rounds.append(seconds)

    def round_seconds(self, *, rounds: int) -> float | None:
        """The median of the decomposition rounds timed, once ``rounds`` were (None: fewer yet)."""
        return statistics.median(self._rounds) if len(self._rounds) >= rounds else None

    def mark(self, *, plain: bool, device: torch.device) -> None:
        """The start of a step; ``plain``: it decomposes and captures nothing (its interval is a plain step)."""
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((event, plain))
        else:
            self._marks.append((time.perf_counter(), plain))

    def plain_seconds(self) -> float | None:
        """The steady plain step: the lower quartile of the intervals from a plain step's start to the next step's
        (None: fewer than 3 measured). A run's first steps and disturbed ones only ever run slower; their median
        was 10% above the steady step on BERT-mini (tests/kaisa_ds/test_timing.py)."""
        marks = list(self._marks)
        spans = []
        for (start, plain), (end, _) in itertools.pairwise(marks):
            if not plain:
                continue
            if isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
                end.synchronize()
                spans.append(start.elapsed_time(end) / 1000.0)
            elif isinstance(start, float) and isinstance(end, float):
                spans.append(end - start)
        return statistics.quantiles(spans, n=4)[0] if len(spans) >= 3 else None


class HostFlag:
    """A device-side boolean read a step later without a host sync: on a GPU, copied to pinned memory behind an
    event (:meth:`ready` asks the event without waiting); on the CPU, the value itself. ``host`` is the copy the
    host reads: nothing on the device waits for it (:meth:`is_host_copy` tells such tensors, for sync counters)."""

    _hosts: ClassVar[weakref.WeakSet[torch.Tensor]] = weakref.WeakSet()

    def __init__(self, flag: torch.Tensor) -> None:
        if flag.is_cuda:
            self.host = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.host.copy_(flag, non_blocking=True)
            self._event: torch.cuda.Event | None = torch.cuda.Event()
            self._event.record()
        else:
            self.host, self._event = flag.detach(), None
        HostFlag._hosts.add(self.host)

    @staticmethod
    def is_host_copy(tensor: object) -> bool:
        """Whether ``tensor`` is a flag's host copy (reading it never waits for the device)."""
        return isinstance(tensor, torch.Tensor) and tensor in HostFlag._hosts

    def ready(self) -> bool:
        """Whether the value has arrived (always on the CPU)."""
        return self._event is None or bool(self._event.query())

    def value(self) -> bool:
        """The flag (waits for its copy if it has not arrived)."""
        if self._event is not None:
            self._event.synchronize()
        return bool(self.host)
