"""kaisa_ds.report.metrics_log: one writer for every metrics.jsonl: strict JSON lines whose non-finite floats read
back as floats, nothing written by the ranks that do not log, a resume cuts the log back to its step."""

from __future__ import annotations

import json
import math
from pathlib import Path

from kaisa_ds.report.metrics_log import MetricsLog, read_rows


def _strict(line: str) -> dict:
    def refuse(token: str) -> None:
        raise ValueError(f"{token} is not JSON")

    return json.loads(line, parse_constant=refuse)  # type: ignore[arg-type]


def test_non_finite_floats_are_strict_json_and_read_back_as_floats(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, enabled=True)
    log.write({"step": 1, "loss": math.nan, "kfac": {"kl_scale": math.inf, "ranges": [1.0, -math.inf]},
               "event": "train"})
    (line,) = path.read_text().splitlines()
    assert _strict(line)["kfac"]["ranges"][0] == 1.0  # any JSON reader takes it
    (row,) = read_rows(path)
    assert math.isnan(row["loss"]) and row["kfac"]["kl_scale"] == math.inf and row["kfac"]["ranges"] == [1.0, -math.inf]
    assert row["event"] == "train" and row["step"] == 1


def test_logs_written_with_nan_tokens_still_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": math.nan}) + "\n")  # what pretraining wrote before
    assert math.isnan(read_rows(path)[0]["loss"])


def test_a_rank_that_does_not_log_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    log = MetricsLog(path, enabled=False)
    log.write({"step": 1, "loss": 2.0})
    assert not path.parent.exists()


def test_opening_starts_empty_or_keeps_the_rows_up_to_the_resume_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, enabled=True)
    for step in (1, 2, 3):
        log.write({"step": step, "loss": 1.0 / step})
    assert [r["step"] for r in MetricsLog(path, enabled=True, resume_step=2).rows()] == [1, 2]
    assert MetricsLog(path, enabled=True).rows() == []
