"""The official SQuAD v1.1 metric (exact match and token F1) and the official script's command line.

Same normalisation and scoring as ``evaluate-v1.1.py`` from the SQuAD site, so figures are comparable with
published ones: lower case, drop punctuation, drop the articles a/an/the, collapse whitespace; per question the
maximum over its gold answers; averaged over every question of the dataset, as percentages.

    python -m squad_finetune.evaluate DATASET.json PREDICTIONS.json   # last line: {"exact_match": .., "f1": ..}
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import string
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squad_finetune.squad_json import SquadFormatError, gold_answers, read_squad_file

logger = logging.getLogger(__name__)

EXPECTED_VERSION = "1.1"
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower case, remove punctuation, articles and extra whitespace (in the official script's order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when both normalise to the same string."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """Harmonic mean of token precision and recall after normalisation (0 when no token is shared)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _max_over_ground_truths(
    metric: Callable[[str, str], float], prediction: str, ground_truths: Iterable[str]
) -> float:
    return max(metric(prediction, gt) for gt in ground_truths)


@dataclass(frozen=True)
class SquadScores:
    """Percentages over ``total`` questions; ``missing`` of them had no prediction and scored 0."""

    exact_match: float
    f1: float
    total: int
    missing: int

    def official(self) -> dict[str, float]:
        """The official script's output dictionary."""
        return {"exact_match": self.exact_match, "f1": self.f1}


def score_predictions(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> SquadScores:
    """Score ``predictions`` (question id -> answer text) against ``gold`` (question id -> gold answer texts).

    Every question in ``gold`` counts; one without a prediction scores 0, as in the official script.
    """
    if not gold:
        raise ValueError("cannot score an evaluation set with no questions")
    empty = [qid for qid, answers in gold.items() if not answers]
    if empty:
        raise ValueError(f"{len(empty)} question(s) have no gold answers (first: {empty[0]!r}); drop them first")
    exact = f1 = 0.0
    missing: list[str] = []
    for qid, answers in gold.items():
        if qid not in predictions:
            missing.append(qid)
            continue
        exact += _max_over_ground_truths(exact_match_score, predictions[qid], answers)
        f1 += _max_over_ground_truths(f1_score, predictions[qid], answers)
    if missing:
        logger.warning(
            "%d of %d question(s) have no prediction and will receive score 0 (first: %s)",
            len(missing), len(gold), ", ".join(missing[:5]),
        )
    total = len(gold)
    return SquadScores(exact_match=100.0 * exact / total, f1=100.0 * f1 / total, total=total, missing=len(missing))


def evaluate(dataset: list[dict[str, Any]], predictions: Mapping[str, str]) -> dict[str, float]:
    """The official ``evaluate(dataset, predictions)``: ``dataset`` is the file's ``data`` list."""
    gold = {qid: answers for qid, answers in gold_answers(dataset)}
    return score_predictions(gold, predictions).official()


def read_predictions(path: Path) -> dict[str, str]:
    """A predictions file: one JSON object mapping question id to answer text."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SquadFormatError(f"{path}: predictions file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SquadFormatError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise SquadFormatError(f"{path}: expected a JSON object mapping question id to answer text, "
                               f"got {type(raw).__name__}")
    bad = [k for k, v in raw.items() if not isinstance(v, str)]
    if bad:
        raise SquadFormatError(f"{path}: the answer for question {bad[0]!r} is not a string "
                               f"({len(bad)} such entries); every value must be the answer text")
    return raw


def main(argv: Sequence[str] | None = None) -> int:
    """Command line with the official script's interface; the last printed line is the result."""
    parser = argparse.ArgumentParser(
        prog="python -m squad_finetune.evaluate",
        description=f"Evaluation for SQuAD {EXPECTED_VERSION}: exact match and F1 (percentages) of a predictions "
        "file against a dataset file, as the official evaluate-v1.1.py computes them.",
    )
    parser.add_argument("dataset_file", type=Path, help="SQuAD v1.1 JSON dataset (version, data[].paragraphs[])")
    parser.add_argument("prediction_file", type=Path, help="JSON object mapping each question id to its answer text")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        squad = read_squad_file(args.dataset_file, check_spans=False)
        if squad.version != EXPECTED_VERSION:
            logger.warning("Evaluation expects v-%s, but got dataset with v-%s", EXPECTED_VERSION, squad.version)
        predictions = read_predictions(args.prediction_file)
        scores = score_predictions(squad.gold(), predictions)
    except (SquadFormatError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(scores.official()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
