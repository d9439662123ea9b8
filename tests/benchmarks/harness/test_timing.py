"""``timed`` (now through kaisa_ds's StageTimer) still drains a GPU's queue before and after the call, and only
when asked, and measures the call's wall time."""

from __future__ import annotations

import time

import pytest
import torch

from benchmarks.harness.timing import timed


def test_timed_measures_the_call() -> None:
    seconds = timed(lambda: time.sleep(0.05), cuda=False)
    assert 0.05 <= seconds < 0.5


@pytest.mark.parametrize(("cuda", "expected"), [(True, ["sync", "call", "sync"]), (False, ["call"])])
def test_timed_synchronises_around_the_call_on_a_gpu_only(monkeypatch: pytest.MonkeyPatch, cuda: bool,
                                                           expected: list[str]) -> None:
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))
    timed(lambda: events.append("call"), cuda=cuda)
    assert events == expected
