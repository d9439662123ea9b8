"""mission.stages: a rerun skips finished stages, resumes an interrupted one, and redoes changed ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mission import stages
from mission.stages import StageRecord


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    calls: list[tuple[str, list[str]]] = []

    def fake_launch(module: str, args: list[str], *, ranks: int, log: Path) -> float:
        calls.append((module, args))
        if "--crash" in args:
            raise RuntimeError("stage failed")
        return 12.5

    monkeypatch.setattr(stages, "launch", fake_launch)
    return calls


def _run(tmp_path: Path, args: list[str], *, fresh: bool = False) -> float:
    record = StageRecord(tmp_path / "stages.json", fresh=fresh)
    return record.run("lamb/phase1", "bert_pretrain", args, output=tmp_path / "summary.json", log=tmp_path / "log",
                      ranks=2, resume_flag="--resume")


def test_finished_stage_is_skipped_with_its_recorded_seconds(tmp_path: Path, launches: list) -> None:
    assert _run(tmp_path, ["--max-steps", "5"]) == 12.5
    (tmp_path / "summary.json").write_text("{}")
    assert _run(tmp_path, ["--max-steps", "5"]) == 12.5
    assert launches == [("bert_pretrain", ["--max-steps", "5"])]


def test_changed_arguments_fresh_flag_or_missing_output_rerun(tmp_path: Path, launches: list) -> None:
    _run(tmp_path, ["--max-steps", "5"])
    _run(tmp_path, ["--max-steps", "5"])  # output absent: runs again (resuming the same arguments)
    (tmp_path / "summary.json").write_text("{}")
    _run(tmp_path, ["--max-steps", "6"])
    _run(tmp_path, ["--max-steps", "6"], fresh=True)
    assert [a for _, a in launches] == [["--max-steps", "5"], ["--max-steps", "5", "--resume"],
                                        ["--max-steps", "6"], ["--max-steps", "6"]]


def test_interrupted_stage_resumes_on_the_next_run(tmp_path: Path, launches: list) -> None:
    with pytest.raises(RuntimeError):
        _run(tmp_path, ["--crash"])
    with pytest.raises(RuntimeError):
        _run(tmp_path, ["--crash"])
    assert launches[-1] == ("bert_pretrain", ["--crash", "--resume"])


def test_a_rerun_stage_reruns_what_reads_its_output_and_changed_data_reruns_its_reader(
        tmp_path: Path, launches: list) -> None:
    from mission.stages import file_digest

    data = tmp_path / "corpus.txt"
    data.write_text("one")
    (tmp_path / "summary.json").write_text("{}")

    def chain(steps: str) -> None:
        record = StageRecord(tmp_path / "stages.json", fresh=False)
        common: dict[str, Any] = {"output": tmp_path / "summary.json", "log": tmp_path / "log", "ranks": 2}
        record.run("p1", "bert_pretrain", ["--max-steps", steps], inputs=[file_digest([data])], **common)
        record.run("p2", "bert_pretrain", ["--phase", "2"], inputs=[record.token("p1")], **common)

    chain("5")
    chain("5")  # nothing changed: both skipped
    chain("6")  # phase 1 changed: phase 2, with unchanged arguments, must run again
    data.write_text("two")
    chain("6")  # the data changed under the same path: both run
    assert [a for _, a in launches] == [["--max-steps", "5"], ["--phase", "2"], ["--max-steps", "6"], ["--phase", "2"],
                                        ["--max-steps", "6"], ["--phase", "2"]]


def test_a_stage_that_starts_over_is_told_to_replace_its_old_output(tmp_path: Path, launches: list) -> None:
    """bert_pretrain refuses an --output that holds a run unless told --overwrite: the record passes it exactly
    when it does not resume."""
    record = StageRecord(tmp_path / "stages.json", fresh=False)
    common: dict[str, Any] = {"output": tmp_path / "summary.json", "log": tmp_path / "log", "ranks": 2,
                              "resume_flag": "--resume", "restart_flag": "--overwrite"}
    with pytest.raises(RuntimeError):
        record.run("p1", "bert_pretrain", ["--crash"], **common)
    with pytest.raises(RuntimeError):
        record.run("p1", "bert_pretrain", ["--crash"], **common)
    record.run("p1", "bert_pretrain", ["--max-steps", "6"], **common)
    assert [a for _, a in launches] == [["--crash", "--overwrite"], ["--crash", "--resume"],
                                        ["--max-steps", "6", "--overwrite"]]


def test_the_record_is_durable_before_the_stage_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A power loss during a stage must not lose the record that it started (a rerun resumes it): the file and its
    folder are fsynced before the launch."""
    import os

    synced: list[str] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))[1])

    def fake_launch(module: str, args: list[str], *, ranks: int, log: Path) -> float:
        assert str(tmp_path) in synced and any(".stages.json" in p for p in synced)  # the folder and the file
        return 1.0

    monkeypatch.setattr(stages, "launch", fake_launch)
    _run(tmp_path, ["--max-steps", "5"])
