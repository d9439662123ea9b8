"""Two-rank CPU pretraining under the deepspeed launcher on the built-in corpus with the tiny model:
phase 1 then phase 2, with and without K-FAC; a killed run resumed with the same losses; bad inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bert_pretrain.cli import build_parser
from kaisa_ds.optim.poly_warmup import poly_warmup_factor
from tests.support.bert_data import corpus_file
from tests.support.launch import REPO_ROOT, run_deepspeed

STEPS = 10


def _pretrain(root: Path, out: str, *extra: str, phase: int = 1, kfac: bool = False, steps: int = STEPS) -> Path:
    config = f"ds_configs/bert_tiny_phase{phase}{'_kfac' if kfac else ''}.json"
    run_deepspeed(["--module", "bert_pretrain", "--phase", str(phase), "--config", config,
                   "--data", str(root / "corpus.txt"), "--output", str(root / out), "--data-cache", str(root / "data"),
                   "--max-steps", str(steps), "--eval-every", "5", "--eval-examples", "64", "--save-every", "4",
                   "--keep-checkpoints", "2", "--dupe-factor", "2", *extra])
    return root / out


def _schedule(phase: int, steps: int) -> list[float]:
    """NVIDIA's warmup-then-decay rates for the tiny config of ``phase`` stretched over ``steps`` steps."""
    config = json.loads((REPO_ROOT / f"ds_configs/bert_tiny_phase{phase}.json").read_text())
    return [config["optimizer"]["params"]["lr"] * poly_warmup_factor(k, total_steps=steps, warmup_proportion=
                                                                     config["lr_schedule"]["warmup_proportion"])
            for k in range(1, steps + 1)]


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pretrain")
    corpus_file(folder, articles=150)
    return folder


def _check_phase1(run: Path, *, kfac: bool) -> list[dict[str, Any]]:
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert sum(r["loss"] for r in rows[-3:]) < sum(r["loss"] for r in rows[:3]) - 0.3  # learning
    assert [r["lr"] for r in rows] == pytest.approx(_schedule(1, STEPS))  # the config's schedule over --max-steps
    assert all(r["skipped_steps"] == 0 and r["loss_scale"] == 1.0 and r["seq_per_s"] > 0 for r in rows)
    assert ("kfac_ms" in rows[-1]) == kfac
    if kfac:
        assert rows[-1]["kfac_ms"]["preconditioning"] > 0 and max(r["kfac_ms"]["decomposition"] for r in rows) > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["kfac"] == kfac and summary["world_size"] == 2 and summary["global_batch"] == 32
    assert {"heldout_mlm_loss", "heldout_mlm_accuracy", "heldout_nsp_accuracy"} <= summary.keys()
    assert [r["step"] for r in rows if "heldout_mlm_loss" in r] == [5, 10]
    assert (run / "loss.png").stat().st_size > 5000
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json"} <= {p.name for p in
                                                                                     (run / "final").iterdir()}
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step{STEPS}"
    assert sorted(p.name for p in (run / "checkpoints").glob("step*")) == [f"step{STEPS}", "step8"]  # 2 kept
    return rows


def _check_phase2(run: Path, phase1: list[dict[str, Any]]) -> None:
    rows = _rows(run)
    assert len(rows) == 3
    assert rows[0]["mlm_loss"] < phase1[0]["mlm_loss"] - 0.3  # starts from phase 1's weights, not from scratch
    assert [r["lr"] for r in rows] == pytest.approx(_schedule(2, 3))  # its own schedule
    assert json.loads((run / "summary.json").read_text())["phase"] == 2


@pytest.mark.slow  # ~30 s; default suite: learning in test_learning.py; the mission runs both phases
def test_lamb_phase1_then_phase2(root: Path) -> None:
    phase1 = _check_phase1(_pretrain(root, "lamb1"), kfac=False)
    run = _pretrain(root, "lamb2", "--init-checkpoint", str(root / "lamb1" / "final"), phase=2, steps=3)
    _check_phase2(run, phase1)


def _kfac_phase1(root: Path) -> list[dict[str, Any]]:
    """The K-FAC phase-1 run (trained once per module): phase 2's start and the resume check's reference."""
    if not (root / "kfac1" / "summary.json").is_file():
        _check_phase1(_pretrain(root, "kfac1", kfac=True), kfac=True)
    return _rows(root / "kfac1")


@pytest.mark.slow  # ~60 s; default suite: learning in test_learning.py, both phases through the mission's tests
def test_kfac_phase1_then_phase2(root: Path) -> None:
    full = _kfac_phase1(root)
    run = _pretrain(root, "kfac2", "--init-checkpoint", str(root / "kfac1" / "final"), phase=2, kfac=True, steps=3)
    _check_phase2(run, full)


@pytest.mark.slow  # ~25 s; default suite: exact resume in tests/kaisa_ds/checkpoint/test_shards.py
def test_kfac_resume_logs_the_uninterrupted_losses(root: Path) -> None:
    """A run killed after step 6 (last checkpoint at step 4) and resumed must log the same losses at every step as
    the uninterrupted run, K-FAC state, data position and RNG included."""
    full = _kfac_phase1(root)
    _pretrain(root, "killed", "--stop-after", "6", kfac=True)
    assert [r["step"] for r in _rows(root / "killed")] == list(range(1, 7))
    assert (root / "killed" / "checkpoints" / "latest").read_text().strip() == "step4"
    resumed = _rows(_pretrain(root, "killed", "--resume", kfac=True))
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in full], rel=1e-5)
    assert resumed[-1]["heldout_mlm_loss"] == pytest.approx(full[-1]["heldout_mlm_loss"], rel=1e-5)
    assert json.loads((root / "killed" / "summary.json").read_text())["resumed_from"] == 4


@pytest.mark.slow  # ~45 s; default suite: the mission passes --stop-at-heldout (tests/mission/test_inputs.py)
def test_stop_at_heldout_ends_the_phase_at_the_first_evaluation_reaching_it(root: Path) -> None:
    """Any first held-out loss is below 100, so the phase ends at its first evaluation (step 5 of 10), saved there
    as final/, with the learning rates of the 10-step schedule; --resume then leaves the finished run alone."""
    run = _pretrain(root, "stopped", "--stop-at-heldout", "100")
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["lr"] for r in rows] == pytest.approx(_schedule(1, STEPS)[:5])
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["scheduled_steps"], summary["stopped_at_heldout"]) == (5, STEPS, 100.0)
    assert summary["heldout_mlm_loss"] == rows[-1]["heldout_mlm_loss"]
    assert (run / "final" / "model.safetensors").is_file()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step5"
    _pretrain(root, "stopped", "--stop-at-heldout", "100", "--resume")
    assert len(_rows(run)) == 5 and json.loads((run / "summary.json").read_text()) == summary


def test_a_held_out_loss_reaches_the_stop_only_at_or_below_it() -> None:
    from bert_pretrain.train import reached_target

    assert reached_target({"heldout_mlm_loss": 4.0}, 4.0) and reached_target({"heldout_mlm_loss": 3.9}, 4.0)
    assert not reached_target({"heldout_mlm_loss": 4.01}, 4.0)
    assert not reached_target({"loss": 1.0}, 4.0)  # a step without an evaluation
    assert not reached_target({"heldout_mlm_loss": 1.0}, None)


def test_bad_input_exits_with_a_message_naming_the_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bert_pretrain", "--phase", "1", "--config", "ds_configs/bert_tiny_phase1.json",
         "--data", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "run")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"--data: {tmp_path / 'missing.txt'} does not exist" in proc.stderr


def test_help_explains_every_flag() -> None:
    parser = build_parser()
    for action in parser._actions:
        assert action.help, action.option_strings
    text = parser.format_help()
    assert "--module bert_pretrain" in text and "--init-checkpoint" in text
