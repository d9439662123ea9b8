"""Reading and validating SQuAD v1.1 JSON files.

Every structural problem is reported up front with the file name and the place in it (``data[3].paragraphs[0]
.qas[2].answers[0].answer_start``), so a bad file fails here and not deep inside tokenisation or training. Problems
that only affect single answers or questions (an ``answer_start`` that does not point at the answer text, a
question without answers) are skipped, counted and logged instead, so one bad record does not sink a whole file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAX_REPORTED_PROBLEMS = 10


class SquadFormatError(ValueError):
    """A SQuAD file that cannot be used; the message names the file, the place in it and what is wrong."""


@dataclass
class SkipCounts:
    """Records dropped while reading, with a few examples for the log."""

    bad_answer_spans: int = 0
    questions_without_answers: int = 0
    examples: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(message)

    @property
    def total(self) -> int:
        return self.bad_answer_spans + self.questions_without_answers


@dataclass
class SquadFile:
    """A validated SQuAD file: its raw ``data`` list and one flat record per usable question.

    Records use the Hugging Face ``squad`` schema (id, title, context, question, answers{text, answer_start})
    plus ``article`` (the article's index in ``data``), which the by-article split needs.
    """

    path: Path
    version: str
    data: list[dict[str, Any]]
    records: list[dict[str, Any]]
    skipped: SkipCounts

    def gold(self) -> dict[str, list[str]]:
        """Question id -> gold answer texts, for the metric."""
        return {r["id"]: list(r["answers"]["text"]) for r in self.records}


def gold_answers(data: list[dict[str, Any]]) -> Iterator[tuple[str, list[str]]]:
    """(question id, gold answer texts) for every question of an already-parsed ``data`` list."""
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield qa["id"], [a["text"] for a in qa["answers"]]


def _load_json(path: Path) -> Any:
    if not path.exists():
        raise SquadFormatError(f"{path}: file not found")
    if not path.is_file():
        raise SquadFormatError(f"{path}: not a regular file")
    raw = path.read_bytes()
    if not raw.strip():
        raise SquadFormatError(f"{path}: the file is empty; expected a SQuAD v1.1 JSON object "
                               '{"version": "1.1", "data": [...]}')
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SquadFormatError(f"{path}: not UTF-8 text ({exc})") from None
    except json.JSONDecodeError as exc:
        raise SquadFormatError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


class _Validator:
    """Walks the parsed JSON once, collecting structural problems and building the flat records."""

    def __init__(self, path: Path, *, check_spans: bool) -> None:
        self.path = path
        self.check_spans = check_spans
        self.problems: list[str] = []
        self.records: list[dict[str, Any]] = []
        self.skipped = SkipCounts()
        self.seen_ids: dict[str, str] = {}

    def _typed(self, obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if key not in obj:
            self.problems.append(f"{where}: missing key {key!r}")
            return None
        value = obj[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            self.problems.append(f"{where}.{key}: expected {names}, got {type(value).__name__}")
            return None
        return value

    def _object(self, value: Any, where: str) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.problems.append(f"{where}: expected a JSON object, got {type(value).__name__}")
            return None
        return value

    def top(self, doc: Any) -> tuple[str, list[Any]]:
        root = self._object(doc, "top level")
        if root is None:
            return "", []
        version = root.get("version", "")
        if "version" not in root:
            logger.warning("%s: no 'version' field; reading it as SQuAD v1.1", self.path)
            version = "1.1"
        elif not isinstance(version, str):
            self.problems.append(f"version: expected a string such as \"1.1\", got {type(version).__name__} "
                                 f"{version!r}")
        data = self._typed(root, "data", list, "top level")
        return (version if isinstance(version, str) else ""), (data or [])

    def article(self, index: int, article: Any) -> None:
        where = f"data[{index}]"
        obj = self._object(article, where)
        if obj is None:
            return
        title = obj.get("title", "")
        if not isinstance(title, str):
            self.problems.append(f"{where}.title: expected str, got {type(title).__name__}")
        paragraphs = self._typed(obj, "paragraphs", list, where) or []
        for p_index, paragraph in enumerate(paragraphs):
            self.paragraph(index, str(title), paragraph, f"{where}.paragraphs[{p_index}]")

    def paragraph(self, article: int, title: str, paragraph: Any, where: str) -> None:
        obj = self._object(paragraph, where)
        if obj is None:
            return
        context = self._typed(obj, "context", str, where)
        qas = self._typed(obj, "qas", list, where) or []
        for q_index, qa in enumerate(qas):
            self.question(article, title, context, qa, f"{where}.qas[{q_index}]")

    def question(self, article: int, title: str, context: str | None, qa: Any, where: str) -> None:
        obj = self._object(qa, where)
        if obj is None:
            return
        qid = self._typed(obj, "id", str, where)
        question = self._typed(obj, "question", str, where)
        answers = self._typed(obj, "answers", list, where)
        if qid is not None:
            if qid in self.seen_ids:
                self.problems.append(f"{where}.id: duplicate question id {qid!r} (also at {self.seen_ids[qid]}); "
                                     "ids must be unique for predictions.json")
            self.seen_ids[qid] = where
        texts: list[str] = []
        starts: list[int] = []
        for a_index, answer in enumerate(answers or []):
            a_where = f"{where}.answers[{a_index}]"
            obj_a = self._object(answer, a_where)
            if obj_a is None:
                continue
            text = self._typed(obj_a, "text", str, a_where)
            start = self._typed(obj_a, "answer_start", int, a_where)
            if text is None or start is None or context is None:
                continue
            if self.check_spans and (not text.strip() or start < 0 or context[start:start + len(text)] != text):
                self.skipped.bad_answer_spans += 1
                self.skipped.note(f"{a_where}: answer_start {start} does not point at {text!r} "
                                  f"(context there: {context[max(start, 0):max(start, 0) + len(text)]!r})")
                continue
            texts.append(text)
            starts.append(start)
        if qid is None or question is None or context is None or answers is None:
            return
        if not texts:
            self.skipped.questions_without_answers += 1
            self.skipped.note(f"{where}: question {qid!r} has no usable answer")
            return
        self.records.append({
            "id": qid, "title": title, "context": context, "question": question,
            "answers": {"text": texts, "answer_start": starts}, "article": article,
        })


def read_squad_file(path: str | Path, *, check_spans: bool = True) -> SquadFile:
    """Parse and validate a SQuAD v1.1 file.

    Raises :class:`SquadFormatError` (naming the file and each place) for unreadable files, structural problems
    (missing keys, wrong types, duplicate ids) and files without a usable question. With ``check_spans``, answers
    whose ``answer_start`` does not point at their text are dropped, and questions left without answers are
    skipped; both are counted in ``skipped`` and logged.
    """
    path = Path(path)
    validator = _Validator(path, check_spans=check_spans)
    version, data = validator.top(_load_json(path))
    for index, article in enumerate(data):
        validator.article(index, article)
    problems = validator.problems
    if problems:
        shown = "\n  ".join(problems[:MAX_REPORTED_PROBLEMS])
        hidden = len(problems) - MAX_REPORTED_PROBLEMS
        more = f"\n  ... and {hidden} more" if hidden > 0 else ""
        raise SquadFormatError(f"{path}: {len(problems)} problem(s) in the SQuAD JSON structure "
                               f"(expected data[].paragraphs[].context/qas[].id/question/answers[].text/"
                               f"answer_start):\n  {shown}{more}")
    skipped = validator.skipped
    if skipped.total:
        logger.warning(
            "%s: skipped %d answer(s) whose answer_start does not match the context and %d question(s) without a "
            "usable answer; e.g. %s", path, skipped.bad_answer_spans, skipped.questions_without_answers,
            "; ".join(skipped.examples[:3]),
        )
    if not validator.records:
        reason = f" ({skipped.total} record(s) were skipped, see the warning above)" if skipped.total else ""
        raise SquadFormatError(f"{path}: contains no usable questions{reason}")
    return SquadFile(path=path, version=version, data=data, records=validator.records, skipped=skipped)
