"""SQuAD files as Hugging Face ``datasets``, and the by-article split that turns one file into a train/eval pair.

Files are validated by :mod:`squad_finetune.squad_json` and flattened to the Hub ``squad`` schema, so the rest of
the pipeline is the same for the real dev set, a user's own files and the built-in generated questions.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from squad_finetune.squad_json import SquadFile, SquadFormatError, read_squad_file

logger = logging.getLogger(__name__)

SQUAD_FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "title": datasets.Value("string"),
    "context": datasets.Value("string"),
    "question": datasets.Value("string"),
    "answers": {
        "text": datasets.Sequence(datasets.Value("string")),
        "answer_start": datasets.Sequence(datasets.Value("int32")),
    },
    "article": datasets.Value("int32"),
})


def load_squad_dataset(path: str | Path, *, max_articles: int | None = None) -> tuple[datasets.Dataset, SquadFile]:
    """A validated SQuAD v1.1 file as a ``datasets.Dataset`` (one row per usable question), with its parse.

    ``max_articles`` keeps only the file's first articles (quick runs on large files).
    """
    squad = read_squad_file(path)
    if squad.version != "1.1":
        logger.warning("%s: version %r; this pipeline implements SQuAD v1.1 (every question answerable)",
                       squad.path, squad.version)
    records = squad.records
    if max_articles is not None:
        if max_articles < 1:
            raise ValueError(f"max_articles must be >= 1, got {max_articles}")
        records = [r for r in records if r["article"] < max_articles]
        squad.records = records
    return datasets.Dataset.from_list(records, features=SQUAD_FEATURES), squad


@dataclass(frozen=True)
class SplitSummary:
    """How many articles and questions went to each side of a split."""

    train_articles: int
    eval_articles: int
    train_questions: int
    eval_questions: int


def split_by_article(
    source: str | Path, train_out: str | Path, eval_out: str | Path, *, eval_fraction: float = 0.2, seed: int = 0
) -> SplitSummary:
    """Write ``source``'s articles to two SQuAD files, ``eval_fraction`` of them (at least one) to ``eval_out``.

    Splitting by article, not by question, keeps every context on one side, so the eval set measures reading
    unseen passages. The choice of articles is random but fixed by ``seed``.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be strictly between 0 and 1, got {eval_fraction}")
    squad = read_squad_file(source, check_spans=False)
    articles = list(range(len(squad.data)))
    if len(articles) < 2:
        raise SquadFormatError(f"{squad.path}: has {len(articles)} article(s); a by-article split needs at least 2")
    n_eval = min(len(articles) - 1, max(1, round(eval_fraction * len(articles))))
    eval_set = set(random.Random(seed).sample(articles, n_eval))
    sides = {
        Path(eval_out): [a for i, a in enumerate(squad.data) if i in eval_set],
        Path(train_out): [a for i, a in enumerate(squad.data) if i not in eval_set],
    }
    for out, data in sides.items():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"version": squad.version, "data": data}), encoding="utf-8")

    def questions(data: list[dict[str, Any]]) -> int:
        return sum(len(p["qas"]) for a in data for p in a["paragraphs"])

    summary = SplitSummary(
        train_articles=len(articles) - n_eval, eval_articles=n_eval,
        train_questions=questions(sides[Path(train_out)]), eval_questions=questions(sides[Path(eval_out)]),
    )
    logger.info("split %s by article: %s", squad.path, summary)
    return summary
