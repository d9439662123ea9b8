"""overlap: the side-by-side run at toy size: only the overlapped variant starts buckets from the hooks, and both
variants finish their factor reduction inside step()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.overlap import main


@pytest.mark.slow  # ~8 s; default suite: overlapped factors in tests/kaisa_ds/distributed/test_equivalence.py
def test_tiny_run_starts_buckets_from_the_hooks_only_when_overlapped(tmp_path: Path) -> None:
    out = tmp_path / "overlap.json"
    res = main(["--size", "tiny", "--batch", "2", "--seq", "16", "--rounds", "2", "--bucket-mb", "0.01",
                "--dtypes", "fp32", "fp16", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == res["rows"]
    rows = {(r["factor_dtype"], r["variant"]): r for r in res["rows"]}
    assert set(rows) == {(d, v) for d in ("fp32", "fp16") for v in ("synchronous", "overlapped")}
    for dtype in ("fp32", "fp16"):
        assert rows[(dtype, "synchronous")]["hook_launch_s"] == 0
        assert rows[(dtype, "overlapped")]["hook_launch_s"] > 0  # buckets left from the backward hooks
        assert all(rows[(dtype, v)]["step_s"] > 0 for v in ("synchronous", "overlapped"))
