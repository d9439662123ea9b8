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


def test_questions_about_some_of_a_large_corpus_come_from_its_own_articles(tmp_path: Path) -> None:
    """The main job pretrains on 1900 articles but asks about 200: the questions are about articles of the same
    corpus (same contexts), a seeded choice, and their number follows question_articles."""
    import pytest

    from bert_pretrain.corpus import generate_corpus

    train, evaluation, summary = write_builtin_squad(tmp_path / "a", seed=0, num_articles=60, question_articles=20)
    assert summary.train_articles + summary.eval_articles == 20
    corpus = {a.title: a.paragraphs for a in generate_corpus(seed=0, num_articles=60).articles}
    for path in (train, evaluation):
        ds, _ = load_squad_dataset(path)
        assert set(ds["title"]) <= corpus.keys()
        assert all(any(c == p for p in corpus[t]) for t, c in zip(ds["title"], ds["context"]))
    again, _, _ = write_builtin_squad(tmp_path / "b", seed=0, num_articles=60, question_articles=20)
    assert again.read_bytes() == train.read_bytes()
    _, _, everything = write_builtin_squad(tmp_path / "c", seed=0, num_articles=60)
    assert everything.train_articles + everything.eval_articles == 60
    with pytest.raises(ValueError, match="question_articles"):
        write_builtin_squad(tmp_path / "d", seed=0, num_articles=60, question_articles=1)
