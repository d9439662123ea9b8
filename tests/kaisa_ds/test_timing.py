"""The clock of the training steps around K-FAC's, which the cost rule reads for the steady step's length."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds import timing
from kaisa_ds.timing import StepClock


def _clock_with_spans(monkeypatch: pytest.MonkeyPatch, spans: list[float]) -> StepClock:
    """A clock whose plain steps lasted ``spans`` seconds, one after another."""
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    clock = StepClock()
    for span in spans:
        clock.mark(plain=True, device=torch.device("cpu"))
        now[0] += span
    clock.mark(plain=False, device=torch.device("cpu"))
    return clock


def test_the_steady_step_is_not_the_median_of_a_slow_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's first steps run slower (allocator and caches warming, a disturbed moment), and the median of the
    first 30 steps of BERT-mini 64 x 128 (1.55 s) was 10% above the steady step (1.40 s, 2026-12-04): the cost rule
    then chose an interval whose decompositions cost 1.65% of a steady step against a 1.5% budget. The clock gives
    the lower quartile: slow steps, which are only ever slower, do not move it."""
    clock = _clock_with_spans(monkeypatch, [3.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0])  # median 3.0
    assert clock.plain_seconds() == pytest.approx(1.0)


def test_too_few_plain_steps_give_no_length(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _clock_with_spans(monkeypatch, [1.0, 1.0]).plain_seconds() is None
    assert _clock_with_spans(monkeypatch, [1.0, 2.0, 4.0]).plain_seconds() == pytest.approx(1.0)


def test_the_rounds_are_given_as_their_median_once_enough_were_timed() -> None:
    clock = StepClock()
    for seconds in (0.1, 0.5):
        clock.add_round(seconds)
    assert clock.round_seconds(rounds=3) is None
    clock.add_round(0.2)
    assert clock.round_seconds(rounds=3) == pytest.approx(0.2)
