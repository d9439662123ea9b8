"""The official SQuAD v1.1 metric against hand-worked examples, and its command line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from squad_finetune.evaluate import (
    evaluate,
    exact_match_score,
    f1_score,
    main,
    normalize_answer,
    score_predictions,
)
from tests.support.squad_data import REPO_ROOT, small_squad, write_json


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("The Denver Broncos!", "denver broncos"),
        ("  an apple,  a   day ", "apple day"),
        ("Theater of the absurd", "theater of absurd"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("rock 'n' roll", "rock n roll"),
        ("A", ""),
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, normalised: str) -> None:
    assert normalize_answer(raw) == normalised


def test_exact_match_ignores_case_punctuation_and_articles() -> None:
    assert exact_match_score("the Denver Broncos.", "Denver Broncos") == 1.0
    assert exact_match_score("Denver", "Denver Broncos") == 0.0


def test_f1_hand_worked() -> None:
    # prediction tokens [cat, sat, on, mat], gold [cat, on, mat]: precision 3/4, recall 1 -> F1 = 6/7
    assert f1_score("The cat sat on the mat", "cat on a mat") == pytest.approx(6 / 7)
    # repeated tokens count with multiplicity: pred [new, new, york], gold [new, york]: p 2/3, r 1 -> 0.8
    assert f1_score("new new york", "New York") == pytest.approx(0.8)
    assert f1_score("Paris", "London") == 0.0


def test_empty_prediction() -> None:
    assert f1_score("", "Denver Broncos") == 0.0
    assert exact_match_score("", "Denver Broncos") == 0.0
    # as in the official script: both normalise to "", so EM is 1 while F1 (no shared token) is 0
    assert exact_match_score("", "the") == 1.0
    assert f1_score("", "the") == 0.0


def test_max_over_gold_answers_and_average_over_questions() -> None:
    gold = {"a": ["Carl Wilhelm Scheele", "Scheele"], "b": ["near Rotterdam", "Rotterdam"], "c": ["24-10"]}
    preds = {"a": "Scheele", "b": "the North Sea near Rotterdam", "c": "24"}
    scores = score_predictions(gold, preds)
    # a: EM 1, F1 1.  b: best gold "near Rotterdam": pred [north, sea, near, rotterdam] p 2/4 r 1 -> 2/3.  c: 0, 0
    assert scores.exact_match == pytest.approx(100 / 3)
    assert scores.f1 == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)
    assert scores.total == 3
    assert scores.missing == 0


def test_missing_predictions_score_zero_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    gold = {"a": ["x"], "b": ["y"], "c": ["z"], "d": ["w"]}
    with caplog.at_level(logging.WARNING):
        scores = score_predictions(gold, {"a": "x", "b": "y"})
    assert scores.exact_match == pytest.approx(50.0)
    assert scores.missing == 2
    assert "2 of 4 question(s) have no prediction" in caplog.text


def test_official_evaluate_signature_on_data_list() -> None:
    data = small_squad()["data"]
    preds = {"q1": "Broncos", "q2": "24-10", "q3": "Rotterdam", "q4": "Zurich", "q5": "Carl Scheele"}
    out = evaluate(data, preds)
    assert set(out) == {"exact_match", "f1"}
    assert out["exact_match"] == pytest.approx(60.0)
    # q5: "carl scheele" vs "carl wilhelm scheele": p 1, r 2/3 -> 0.8
    assert out["f1"] == pytest.approx(100 * (3 + 0 + 0.8) / 5)


def test_cli_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = write_json(tmp_path / "dev.json", small_squad())
    preds = write_json(tmp_path / "pred.json", {"q1": "Denver Broncos", "q3": "Rotterdam"})
    assert main([str(dataset), str(preds)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == pytest.approx({"exact_match": 40.0, "f1": 40.0})


def test_cli_rejects_bad_predictions_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = write_json(tmp_path / "dev.json", small_squad())
    preds = write_json(tmp_path / "pred.json", ["not", "a", "mapping"])
    assert main([str(dataset), str(preds)]) == 2
    err = capsys.readouterr().err
    assert "pred.json" in err and "JSON object" in err


def test_cli_as_module_last_line(tmp_path: Path) -> None:
    dataset = write_json(tmp_path / "dev.json", small_squad())
    preds = write_json(tmp_path / "pred.json", {"q1": "Broncos", "q2": "24-10", "q3": "x", "q4": "Basel", "q5": ""})
    proc = subprocess.run(
        [sys.executable, "-m", "squad_finetune.evaluate", str(dataset), str(preds)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == pytest.approx({"exact_match": 60.0, "f1": 60.0})
