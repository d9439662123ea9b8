"""End to end on the built-in QA data: 2-rank CPU fine-tuning under the deepspeed launcher lifts F1 well above
the untrained model's; the saved model re-scores identically in eval-only mode; the official metric CLI agrees
with eval_results.json; the K-FAC config trains with the preconditioner inside engine.step."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.launch import run_deepspeed
from tests.support.squad_data import REPO_ROOT, save_untrained_builtin_model

CONFIG = REPO_ROOT / "ds_configs" / "squad_tiny_cpu.json"
KFAC_CONFIG = REPO_ROOT / "ds_configs" / "squad_tiny_cpu_kfac.json"


def _metrics(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def _questions(path: Path) -> dict[str, str]:
    """Question id -> context, read straight from a SQuAD file."""
    data = json.loads(path.read_text())["data"]
    return {q["id"]: p["context"] for a in data for p in a["paragraphs"] for q in p["qas"]}


def _finetune_builtin(tmp_path: Path, *, articles: int, config: Path, extra: list[str]) -> Path:
    model = save_untrained_builtin_model(tmp_path / "untrained", num_articles=articles)
    output = tmp_path / "run"
    run_deepspeed(["--module", "squad_finetune", "--model", str(model), "--builtin-articles", str(articles),
                   "--config", str(config), "--output", str(output), *extra], num_ranks=2)
    return output


@pytest.mark.slow  # ~42 s; default suite: learning in test_learning (real articles), two-rank K-FAC in tests/kaisa_ds,
# the official evaluator's CLI in test_evaluate, --eval-only in test_cli
def test_two_rank_finetune_on_builtin_data_beats_untrained(tmp_path: Path) -> None:
    output = _finetune_builtin(tmp_path, articles=1000, config=CONFIG,
                               extra=["--epochs", "2", "--lr", "2e-3", "--eval-before"])
    train_file, eval_file = output / "data" / "builtin_squad_train.json", output / "data" / "builtin_squad_eval.json"
    train_q, eval_q = _questions(train_file), _questions(eval_file)
    titles = [{a["title"] for a in json.loads(f.read_text())["data"]} for f in (train_file, eval_file)]
    assert len(titles[1]) == 200 and not titles[0] & titles[1]  # split by article, 20% for eval

    results = json.loads((output / "eval_results.json").read_text())
    evals = [m for m in _metrics(output) if m["event"] == "eval"]
    f1_before = evals[0]["f1"]
    assert evals[0]["step"] == 0 and evals[-1]["f1"] == results["f1"]
    assert results["questions"] == len(eval_q)
    assert results["f1"] > 60 and results["f1"] > f1_before + 40, (f1_before, results)

    metrics = _metrics(output)
    assert metrics[0]["event"] == "config" and metrics[0]["world_size"] == 2 and metrics[0]["recipe"]["lr"] == 2e-3
    losses = [m["loss"] for m in metrics if m["event"] == "train"]
    assert losses[-1] < 0.5 * losses[0]
    assert results["train_steps"] == 2 * math.ceil(len(train_q) / 16)  # one window per question, 16 per step

    predictions = json.loads((output / "predictions.json").read_text())
    assert predictions.keys() == eval_q.keys()
    assert all(answer in eval_q[qid] for qid, answer in predictions.items())

    # the official metric's command line gives the same figures from the written files
    official = subprocess.run(
        [sys.executable, "-m", "squad_finetune.evaluate", str(eval_file), str(output / "predictions.json")],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120,
    )
    last = json.loads(official.stdout.strip().splitlines()[-1])
    assert last == pytest.approx({"exact_match": results["exact_match"], "f1": results["f1"]})

    # eval-only on the saved fine-tuned model, in a single process, reproduces the score
    rescored = tmp_path / "rescored"
    subprocess.run(
        [sys.executable, "-m", "squad_finetune", "--eval-only", "--checkpoint", str(output / "model"),
         "--eval-file", str(eval_file), "--config", str(CONFIG), "--output", str(rescored)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
    )
    again = json.loads((rescored / "eval_results.json").read_text())
    assert again["f1"] == pytest.approx(results["f1"], abs=1e-6)
    assert again["train_steps"] == 0


@pytest.mark.slow  # ~30 s; default suite: learning in test_learning.py
def test_two_rank_finetune_with_kfac_config(tmp_path: Path) -> None:
    output = _finetune_builtin(tmp_path, articles=100, config=KFAC_CONFIG,
                               extra=["--max-steps", "20", "--log-every", "5"])
    metrics = _metrics(output)
    assert next(m for m in metrics if m["event"] == "engine")["kfac"] is True
    train = [m for m in metrics if m["event"] == "train"]
    assert train[-1]["kfac_steps"] == 20  # the engine preconditioned every optimizer step
    assert train[-1]["loss"] < train[0]["loss"]
    eval_q = _questions(output / "data" / "builtin_squad_eval.json")
    results = json.loads((output / "eval_results.json").read_text())
    assert results["questions"] == len(eval_q)
    assert results["kfac"] is True and results["config"] == str(KFAC_CONFIG)  # labels read from the run


@pytest.mark.slow
def test_two_rank_kfac_finetune_full_recipe_reaches_high_f1(tmp_path: Path) -> None:
    output = _finetune_builtin(tmp_path, articles=1000, config=KFAC_CONFIG,
                               extra=["--epochs", "2", "--lr", "2e-3", "--eval-before"])
    evals = [m for m in _metrics(output) if m["event"] == "eval"]
    train = [m for m in _metrics(output) if m["event"] == "train"]
    assert evals[0]["f1"] < 20 and evals[-1]["f1"] > 60, evals
    assert train[-1]["kfac_steps"] == train[-1]["step"]
