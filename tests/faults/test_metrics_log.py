"""Defect 5: a metrics.jsonl whose last line was torn by a kill must not make --resume impossible."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kaisa_ds.report.metrics_log import MetricsError, MetricsLog


def _log(path: Path, steps: int) -> None:
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, steps + 1)))


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "metrics.jsonl"
    _log(path, 6)
    path.write_text(path.read_text() + '{"step": 7, "lo')  # killed mid-write
    with caplog.at_level(logging.WARNING):
        log = MetricsLog(path, enabled=True, resume_step=4)
    assert [r["step"] for r in log.rows()] == [1, 2, 3, 4]
    assert "torn last line" in caplog.text and str(path) in caplog.text
    log.write({"step": 5, "loss": 0.2})
    assert [r["step"] for r in log.rows()] == [1, 2, 3, 4, 5]


def test_a_damaged_line_in_the_middle_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _log(path, 3)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    with pytest.raises(MetricsError, match=rf"{path}:2: not a JSON line"):
        MetricsLog(path, enabled=True, resume_step=3)
