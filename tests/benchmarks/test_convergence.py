"""convergence: a few steps of both optimizers on the real WikiText-2 text write curves, a summary and a plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.convergence import DEFAULT_TEXT, DEFAULT_VOCAB, first_reaching, main


@pytest.mark.skipif(not (DEFAULT_TEXT.is_file() and DEFAULT_VOCAB.is_file()),
                    reason=f"real data absent: {DEFAULT_TEXT} and {DEFAULT_VOCAB}")
def test_tiny_run_records_sweep_curves_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "convergence.json"
    main(["--model-size", "small", "--seq", "32", "--batch", "4", "--steps", "6", "--sweep-steps", "2",
          "--lr-grid", "0.01", "0.02", "--damping-grid", "0.01", "--kfac-lr-scales", "1", "--eval-every", "3",
          "--out", str(out)])
    data = json.loads(out.read_text())
    assert [s["kind"] for s in data["sweep"]] == ["lamb_lr", "lamb_lr", "kfac_damping"]
    assert data["chosen"]["lr"] in (0.01, 0.02) and data["chosen"]["damping"] == 0.01
    for run in ("lamb", "kfac"):
        assert [p["step"] for p in data[run]["curve"]] == [3, 6]
        assert all(p["heldout_mlm"] > 0 and p["seconds"] > 0 for p in data[run]["curve"])
    assert data["summary"]["lamb_final_heldout_mlm"] == data["lamb"]["curve"][-1]["heldout_mlm"]
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_first_reaching_picks_the_first_point_at_or_below_the_target() -> None:
    curve = [{"step": 1, "heldout_mlm": 5.0}, {"step": 2, "heldout_mlm": 3.9}, {"step": 3, "heldout_mlm": 3.5}]
    assert first_reaching(curve, 4.0) == curve[1]
    assert first_reaching(curve, 3.0) is None
