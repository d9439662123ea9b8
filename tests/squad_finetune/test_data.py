"""Loading SQuAD files: the happy path, every bad input (clear error or counted skip), the by-article split."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from squad_finetune.data import load_squad_dataset, split_by_article
from squad_finetune.split import main as split_main
from squad_finetune.squad_json import SquadFormatError, read_squad_file
from tests.support.squad_data import DEV_SUBSET, paragraph, requires_dev_subset, small_squad, squad_doc, write_json


def test_loads_flat_rows_with_all_gold_answers(tmp_path: Path) -> None:
    ds, squad = load_squad_dataset(write_json(tmp_path / "s.json", small_squad()))
    assert len(ds) == 5
    assert ds.column_names == ["id", "title", "context", "question", "answers", "article"]
    row = ds[0]
    assert row["id"] == "q1"
    assert row["answers"]["text"] == ["Denver Broncos", "Broncos"]
    assert row["context"][row["answers"]["answer_start"][1]:].startswith("Broncos")
    assert squad.gold()["q3"] == ["near Rotterdam", "Rotterdam"]
    assert ds["article"] == [0, 0, 1, 1, 2]


def _expect_error(tmp_path: Path, content: str | bytes, *fragments: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(SquadFormatError) as info:
        load_squad_dataset(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def test_empty_file(tmp_path: Path) -> None:
    _expect_error(tmp_path, "", "empty")
    _expect_error(tmp_path, "  \n", "empty")


def test_invalid_json(tmp_path: Path) -> None:
    _expect_error(tmp_path, '{"version": "1.1", "data": [', "not valid JSON", "line 1")


def test_not_utf8(tmp_path: Path) -> None:
    _expect_error(tmp_path, b'{"version": "1.1", "data": ["\xff"]}', "UTF-8")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SquadFormatError, match="not found"):
        load_squad_dataset(tmp_path / "nope.json")


def test_top_level_not_object(tmp_path: Path) -> None:
    _expect_error(tmp_path, "[1, 2]", "top level", "JSON object")


def test_missing_data_key(tmp_path: Path) -> None:
    _expect_error(tmp_path, '{"version": "1.1"}', "missing key 'data'")


def test_wrong_version_type(tmp_path: Path) -> None:
    doc = small_squad()
    doc["version"] = 1.1
    _expect_error(tmp_path, json.dumps(doc), "version", "expected a string", "float")


def test_missing_keys_are_located(tmp_path: Path) -> None:
    doc = small_squad()
    del doc["data"][1]["paragraphs"][0]["context"]
    del doc["data"][2]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"]
    doc["data"][0]["paragraphs"][0]["qas"][1]["id"] = 7
    _expect_error(tmp_path, json.dumps(doc), "3 problem(s)",
                  "data[1].paragraphs[0]: missing key 'context'",
                  "data[2].paragraphs[0].qas[0].answers[0]: missing key 'answer_start'",
                  "data[0].paragraphs[0].qas[1].id: expected str, got int")


def test_wrong_container_types(tmp_path: Path) -> None:
    doc = small_squad()
    doc["data"][0]["paragraphs"] = {"context": "x"}
    doc["data"][1]["paragraphs"][0]["qas"][0] = "question?"
    _expect_error(tmp_path, json.dumps(doc), "data[0].paragraphs: expected list, got dict",
                  "data[1].paragraphs[0].qas[0]: expected a JSON object, got str")


def test_duplicate_question_ids(tmp_path: Path) -> None:
    doc = small_squad()
    doc["data"][2]["paragraphs"][0]["qas"][0]["id"] = "q1"
    _expect_error(tmp_path, json.dumps(doc), "duplicate question id 'q1'")


def test_no_questions(tmp_path: Path) -> None:
    _expect_error(tmp_path, '{"version": "1.1", "data": []}', "no usable questions")


def test_bad_answer_start_is_skipped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    doc = small_squad()
    qas = doc["data"][0]["paragraphs"][0]["qas"]
    qas[0]["answers"][1]["answer_start"] += 3  # q1 keeps its other, correct answer
    qas[1]["answers"][0]["answer_start"] = -2  # q2 loses its only answer -> question skipped
    doc["data"][1]["paragraphs"][0]["qas"][1]["answers"].append({"text": " ", "answer_start": 9})  # blank: dropped
    with caplog.at_level(logging.WARNING):
        ds, squad = load_squad_dataset(write_json(tmp_path / "s.json", doc))
    assert squad.skipped.bad_answer_spans == 3
    assert squad.skipped.questions_without_answers == 1
    assert ds["id"] == ["q1", "q3", "q4", "q5"]
    assert ds[0]["answers"]["text"] == ["Denver Broncos"]
    assert ds[2]["answers"]["text"] == ["Basel"]  # q4 keeps its real answer only
    assert "skipped 3 answer(s)" in caplog.text and "s.json" in caplog.text


def test_all_answers_bad_is_an_error(tmp_path: Path) -> None:
    doc = squad_doc([[paragraph("alpha beta", [("a", "?", ["beta"])])]])
    doc["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 0
    _expect_error(tmp_path, json.dumps(doc), "no usable questions", "skipped")


def test_metric_reading_ignores_answer_start(tmp_path: Path) -> None:
    doc = small_squad()
    doc["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] = 999
    squad = read_squad_file(write_json(tmp_path / "s.json", doc), check_spans=False)
    assert squad.gold()["q2"] == ["24-10"] and squad.skipped.total == 0


def test_max_articles(tmp_path: Path) -> None:
    ds, _ = load_squad_dataset(write_json(tmp_path / "s.json", small_squad()), max_articles=2)
    assert ds["id"] == ["q1", "q2", "q3", "q4"]


def test_split_by_article(tmp_path: Path) -> None:
    src = write_json(tmp_path / "all.json", small_squad())
    summary = split_by_article(src, tmp_path / "tr.json", tmp_path / "ev.json", eval_fraction=0.34, seed=3)
    assert (summary.train_articles, summary.eval_articles) == (2, 1)
    train, _ = load_squad_dataset(tmp_path / "tr.json")
    evaluation, _ = load_squad_dataset(tmp_path / "ev.json")
    assert len(train) + len(evaluation) == 5 == summary.train_questions + summary.eval_questions
    assert not set(train["context"]) & set(evaluation["context"])  # no passage on both sides
    again = split_by_article(src, tmp_path / "tr2.json", tmp_path / "ev2.json", eval_fraction=0.34, seed=3)
    assert again == summary and (tmp_path / "ev2.json").read_text() == (tmp_path / "ev.json").read_text()


def test_split_needs_two_articles(tmp_path: Path) -> None:
    src = write_json(tmp_path / "one.json", squad_doc([[paragraph("a b", [("x", "?", ["b"])])]]))
    with pytest.raises(SquadFormatError, match="at least 2"):
        split_by_article(src, tmp_path / "a.json", tmp_path / "b.json")


@requires_dev_subset
def test_split_cli_on_real_dev_subset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = split_main([str(DEV_SUBSET), "--train-out", str(tmp_path / "tr.json"), "--eval-out",
                       str(tmp_path / "ev.json"), "--eval-fraction", "0.25"])
    assert code == 0
    train, _ = load_squad_dataset(tmp_path / "tr.json")
    evaluation, _ = load_squad_dataset(tmp_path / "ev.json")
    assert len(train) + len(evaluation) == 8981
    assert len({t for t in evaluation["title"]}) == 10
    assert "eval: 10 articles" in capsys.readouterr().out
