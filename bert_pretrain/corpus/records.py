"""The generated articles and their questions, with writers for raw text (pretraining) and SQuAD v1.1 JSON."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_pretrain.files import write_if_changed


@dataclass
class QA:
    """One question whose answer is ``paragraph[answer_start:answer_start + len(answer)]``."""

    id: str
    question: str
    answer: str
    answer_start: int


@dataclass
class Article:
    """An encyclopedia article: ``qas[i]`` are the questions answered by ``paragraphs[i]``."""

    title: str
    kind: str
    paragraphs: list[str] = field(default_factory=list)
    qas: list[list[QA]] = field(default_factory=list)

    def questions(self) -> list[QA]:
        return [q for qs in self.qas for q in qs]


@dataclass
class GeneratedCorpus:
    """The articles of one seed, plus writers for the two formats the jobs read."""

    articles: list[Article]
    seed: int

    def documents(self) -> list[str]:
        """One string per article: its title line, then one line per paragraph."""
        return ["\n".join([a.title, *a.paragraphs]) for a in self.articles]

    def write_text(self, path: str | Path) -> Path:
        """Raw text for pretraining: one document per blank-line-separated block."""
        out = Path(path)
        write_if_changed(out, ("\n\n".join(self.documents()) + "\n").encode("utf-8"))  # a rerun keeps the mtime
        return out

    def to_squad(self, articles: list[Article] | None = None) -> dict[str, Any]:
        """SQuAD v1.1 as a dict; paragraphs without questions are left out."""
        data = []
        for article in self.articles if articles is None else articles:
            paragraphs = [{"context": text,
                           "qas": [{"id": q.id, "question": q.question,
                                    "answers": [{"text": q.answer, "answer_start": q.answer_start}]} for q in qas]}
                          for text, qas in zip(article.paragraphs, article.qas) if qas]
            data.append({"title": article.title, "paragraphs": paragraphs})
        return {"version": "1.1", "data": data}

    def write_squad_json(self, path: str | Path, *, articles: list[Article] | None = None) -> Path:
        """Standard SQuAD v1.1 JSON of ``articles`` (default: all of them)."""
        out = Path(path)
        write_if_changed(out, json.dumps(self.to_squad(articles)).encode("utf-8"))
        return out


def split_articles(articles: list[Article], *, eval_fraction: float = 0.2,
                   seed: int = 0) -> tuple[list[Article], list[Article]]:
    """A reproducible (train, eval) split by article, each part in the original order."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction={eval_fraction} must be between 0 and 1")
    if len(articles) < 2:
        raise ValueError(f"cannot split {len(articles)} article(s) into train and eval; generate at least 2")
    order = list(range(len(articles)))
    random.Random(seed).shuffle(order)
    n_eval = min(len(articles) - 1, max(1, round(len(articles) * eval_fraction)))
    held = set(order[:n_eval])
    return ([a for i, a in enumerate(articles) if i not in held], [a for i, a in enumerate(articles) if i in held])
