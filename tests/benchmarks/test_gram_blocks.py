"""benchmarks.gram_blocks: every size asked is timed against the full product and its figures are written."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gram_blocks import main


def test_tiny_run_writes_a_ratio_per_size_and_split(tmp_path: Path) -> None:
    out = tmp_path / "gram.json"
    main(["--features", "8", "300", "--rows", "64", "--blocks", "2", "3", "--repeats", "2", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["rows"], r["features"]) for r in rows] == [(64, 8), (64, 300)]
    for r in rows:
        assert r["full_ms"] > 0 and r["blocks2_ratio"] > 0 and r["blocks3_ratio"] > 0
