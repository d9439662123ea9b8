"""benchmarks.default_overhead at toy scale (random tokens): two copies side by side, measured once the cost rule
has set the interval."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import default_overhead


def test_the_default_overhead_compares_two_copies_side_by_side(tmp_path: Path) -> None:
    # the rows rule's interval is 50 at 64 rows a step: the cost rule times the rounds at 50, 100 and 150
    res = default_overhead.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--steps", "10",
                                 "--warmup-limit", "155", "--out", str(tmp_path / "o.json")])
    assert res["steady_steps"] == 10 and res["kfac_step_s"] > 0 and res["baseline_step_s"] > 0
    assert res["overhead"] == pytest.approx(res["kfac_step_s"] / res["baseline_step_s"] - 1)
    assert res["cost_interval"] is not None  # the steady state starts once the cost rule has set the interval
