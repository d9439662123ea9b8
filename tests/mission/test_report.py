"""mission: the report reads each stage's outputs into one table and plots both variants' loss curves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mission.report import write_report
from mission.run import parse_args


def _fake_run(root: Path, *, loss: float, f1: float, before: float) -> None:
    for phase, steps in (("phase1", 4), ("phase2", 2)):
        (root / phase).mkdir(parents=True)
        rows = [{"step": s, "loss": loss + (steps - s)} for s in range(1, steps + 1)]
        (root / phase / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / phase / "summary.json").write_text(json.dumps(
            {"steps": steps, "final_train_loss": loss, "heldout_mlm_accuracy": 0.25}))
    (root / "squad").mkdir()
    (root / "squad" / "eval_results.json").write_text(json.dumps({"exact_match": f1 - 10, "f1": f1}))
    (root / "squad" / "metrics.jsonl").write_text(json.dumps({"event": "eval", "step": 0, "f1": before}) + "\n")


def test_report_has_one_row_per_variant_with_its_own_figures(tmp_path: Path) -> None:
    runs = {"LAMB": tmp_path / "lamb", "LAMB + K-FAC": tmp_path / "kfac"}
    _fake_run(runs["LAMB"], loss=3.5, f1=40.0, before=7.0)
    _fake_run(runs["LAMB + K-FAC"], loss=3.25, f1=55.5, before=6.5)
    seconds = {"LAMB": {"phase1": 60.0, "phase2": 30.0, "squad": 100.0},
               "LAMB + K-FAC": {"phase1": 70.0, "phase2": 35.0, "squad": 101.0}}
    report = write_report(tmp_path, runs, seconds, {"model": "tiny"})
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in report.read_text().splitlines() if line.startswith("| LAMB")}
    assert rows["LAMB"] == ["4", "2", "90", "3.5000", "3.5000", "0.2500", "30.00", "40.00", "7.00"]
    assert rows["LAMB + K-FAC"] == ["4", "2", "105", "3.2500", "3.2500", "0.2500", "45.50", "55.50", "6.50"]
    assert (tmp_path / "loss_curves.png").stat().st_size > 10_000


def test_missing_stage_outputs_show_as_not_available(tmp_path: Path) -> None:
    report = write_report(tmp_path, {"LAMB": tmp_path / "absent"}, {"LAMB": {}}, {})
    row = next(line for line in report.read_text().splitlines() if line.startswith("| LAMB"))
    assert row.count("n/a") == 8


def test_defaults_fit_the_cpu_budget_and_flags_parse() -> None:
    args = parse_args([])
    assert (args.model_size, args.ranks, args.squad_epochs) == ("tiny", 2, 4)
    args = parse_args(["--model-size", "mini", "--phase1-steps", "7", "--data", "a.txt", "b.txt"])
    assert args.phase1_steps == 7 and [p.name for p in args.data] == ["a.txt", "b.txt"]


@pytest.mark.slow
def test_main_job_end_to_end_short(tmp_path: Path) -> None:
    """The README's main command with fewer steps: every stage runs and the report names both F1 scores."""
    from mission.run import main

    assert main(["--output", str(tmp_path), "--phase1-steps", "6", "--phase2-steps", "2", "--squad-epochs", "1",
                 "--articles", "120"]) == 0
    text = (tmp_path / "report.md").read_text()
    assert text.count("| LAMB") == 2 and "n/a" not in text, text
    assert (tmp_path / "loss_curves.png").is_file()
    print(text, file=sys.stderr)
