"""benchmarks.indefinite counts the damped factors the inverse method cannot invert through Cholesky."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import indefinite

TINY = ["--size", "tiny", "--batch", "2", "--seq", "16", "--passes", "2"]


def test_too_few_rows_leave_undamped_factors_indefinite_and_a_large_damping_covers_them(tmp_path: Path) -> None:
    res = indefinite.main([*TINY, "--dampings", "0", "10", "--relative-dampings", "100",
                           "--out", str(tmp_path / "x.json")])
    rows = res["rows"]
    undamped = [r for r in rows if r["damping"].startswith("damping=0 ")]
    damped = [r for r in rows if r["damping"].startswith("damping=10 ")]
    # 64 rows for 129-wide A factors: singular, and FP16 rounding leaves eigenvalues below zero
    assert sum(r["not_positive_definite"] for r in undamped) > 0
    assert sum(r["not_positive_definite"] for r in damped) == 0
    assert {r["size"] for r in rows} >= {128, 129} and all(r["factors"] > 0 for r in rows)
    relative = [r for r in rows if r["damping"].startswith("relative_damping=100 ")]
    assert len(relative) == len(undamped)  # every size counted at the library's default damping too
    assert (tmp_path / "x.json").is_file()


def test_a_negative_damping_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        indefinite.main([*TINY, "--dampings", "-1", "--out", str(tmp_path / "x.json")])
