"""bert_pretrain.curves: torn metrics lines, held-out curves, interpolated target crossings; --eval-data parsing."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import pytest

from bert_pretrain.curves import Curve, first_crossing, heldout_curve, resumed_elapsed, training_curve
from bert_pretrain.eval_sets import named_text, renamed
from kaisa_ds.report.metrics_log import read_rows


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n" + '{"step": 3, "lo')
    with caplog.at_level(logging.WARNING):
        assert read_rows(path) == [{"step": 1}, {"step": 2}]
    assert "torn last line" in caplog.text
    path.write_text('{"step": 1, "lo\n' + json.dumps({"step": 2}) + "\n")  # not the last line: corruption
    with pytest.raises(ValueError, match=r"metrics\.jsonl:1"):
        read_rows(path)
    assert read_rows(tmp_path / "absent.jsonl") == []


def test_training_curve_averages_each_window_between_evaluations() -> None:
    """Window means at the evaluation steps, the evaluation row's own training loss counted in its window; an
    empty window is NaN, not a neighbour's value."""
    rows = [{"step": s, "elapsed_s": float(s), "mlm_loss": float(s)} for s in range(1, 7)]
    rows[2]["heldout_report_mlm_loss"] = 9.0
    curve = training_curve(rows, at=[3.0, 6.0, 8.0])
    assert curve.steps == [3.0, 6.0, 8.0] and curve.values[:2] == [2.0, 5.0] and curve.seconds[:2] == [3.0, 6.0]
    assert math.isnan(curve.values[2]) and math.isnan(curve.seconds[2])


def test_resumed_elapsed_reads_the_checkpoint_row(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "elapsed_s": 1.5 * s}) + "\n" for s in range(1, 5)))
    assert resumed_elapsed(path, 3) == 4.5
    assert resumed_elapsed(path, 0) == 0.0 and resumed_elapsed(path, 9) == 0.0


def test_curve_takes_evaluated_rows_only() -> None:
    rows = [{"step": 1, "elapsed_s": 1.0}, {"step": 2, "elapsed_s": 2.0, "heldout_report_mlm_loss": 7.0},
            {"step": 3, "elapsed_s": 3.5, "heldout_tune_mlm_loss": 6.0}]
    curve = heldout_curve(rows, column="heldout_report_mlm_loss")
    assert curve == Curve(steps=[2.0], seconds=[2.0], values=[7.0]) and curve.final == 7.0


def test_first_crossing_interpolates_steps_and_seconds() -> None:
    curve = Curve(steps=[10, 20, 30], seconds=[5.0, 12.0, 20.0], values=[8.0, 6.0, 5.0])
    hit = first_crossing(curve, 7.0)  # halfway between the first two points
    assert hit is not None and hit.step == pytest.approx(15.0) and hit.seconds == pytest.approx(8.5)
    hit = first_crossing(curve, 5.5)
    assert hit is not None and hit.step == pytest.approx(25.0) and hit.seconds == pytest.approx(16.0)
    assert first_crossing(curve, 9.0) == first_crossing(curve, 8.0)  # already there at the first evaluation
    assert first_crossing(curve, 8.0) is not None and first_crossing(curve, 8.0).step == 10  # type: ignore[union-attr]
    assert first_crossing(curve, 4.9) is None
    bumpy = Curve(steps=[1, 2, 3], seconds=[1, 2, 3], values=[7.0, 5.0, 8.0])
    assert first_crossing(bumpy, 6.0).step == pytest.approx(1.5)  # type: ignore[union-attr]


def test_eval_data_flag_and_metric_names() -> None:
    assert named_text("report=parts/report.txt") == ("report", Path("parts/report.txt"))
    for bad in ("report", "=x.txt", "re port=x.txt", "report="):
        with pytest.raises(argparse.ArgumentTypeError):
            named_text(bad)
    assert renamed({"heldout_mlm_loss": 1.0, "heldout_nsp_accuracy": 0.5}, "tune") == {
        "heldout_tune_mlm_loss": 1.0, "heldout_tune_nsp_accuracy": 0.5}
