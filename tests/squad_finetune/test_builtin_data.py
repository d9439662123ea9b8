"""The built-in QA data: generated from bert_pretrain's corpus, valid SQuAD v1.1, split by article, deterministic."""

from __future__ import annotations

from pathlib import Path

from squad_finetune.builtin_data import write_builtin_squad
from squad_finetune.data import load_squad_dataset


def test_builtin_squad_files(tmp_path: Path) -> None:
    train, evaluation, summary = write_builtin_squad(tmp_path / "a", seed=0, num_articles=40)
    train_ds, train_file = load_squad_dataset(train)
    eval_ds, eval_file = load_squad_dataset(evaluation)
    assert train_file.skipped.total == eval_file.skipped.total == 0  # every answer_start points at its answer
    assert (summary.train_articles, summary.eval_articles) == (32, 8)
    assert (len(train_ds), len(eval_ds)) == (summary.train_questions, summary.eval_questions)
    assert not set(train_ds["title"]) & set(eval_ds["title"])
    again, _, _ = write_builtin_squad(tmp_path / "b", seed=0, num_articles=40)
    assert again.read_bytes() == train.read_bytes()
    other, _, _ = write_builtin_squad(tmp_path / "c", seed=1, num_articles=40)
    assert other.read_bytes() != train.read_bytes()
