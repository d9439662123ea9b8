"""The metrics log (``metrics.jsonl``): one writer and one reader for every run that keeps one.

One JSON object per line, appended and fsynced by the one rank that writes (a kill loses at most the line being
written). Non-finite floats are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (strict JSON,
readable by any tool) and read back as floats. A resumed run cuts the log back to its checkpoint's step, so the
curve continues without the steps it redoes.

Readers: the pretraining resume and curves, the SQuAD job, the mission report, the benchmarks and
``python -m kaisa_ds.report``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kaisa_ds.checkpoint.atomic import write_atomic

logger = logging.getLogger(__name__)
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # JSON's own spellings, as strings


class MetricsError(ValueError):
    """A JSONL log is damaged in a way a resume cannot repair; the message names the file and line."""


class MetricsLog:
    """Appends rows to ``path``; a no-op where ``enabled`` is False (every rank but the one that logs).

    Opening starts the file empty, or with ``resume_step`` keeps the rows up to that step (those after it are
    redone by the resumed run); a torn last line is dropped there, a damaged earlier one raises
    :class:`MetricsError`.
    """

    def __init__(self, path: Path, *, enabled: bool, resume_step: int | None = None) -> None:
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        kept = []
        if resume_step is not None:
            kept = [r for r in read_rows(path) if r.get("step", 0) <= resume_step]
        write_atomic(path, "".join(_line(r) for r in kept).encode())

    def write(self, row: Mapping[str, Any]) -> None:
        """Append ``row`` as one line and fsync it."""
        if not self.enabled:
            return
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(_line(row))
            fh.flush()
            os.fsync(fh.fileno())

    def rows(self) -> list[dict[str, Any]]:
        return read_rows(self.path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file (none when it does not exist). A torn last line (the process was killed mid-write)
    is dropped with a warning, since the step it belongs to is redone after a resume; a bad line before it is an
    error naming the file and line. Non-finite floats come back as floats, however they were written."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line, object_hook=_restore))
        except json.JSONDecodeError as exc:
            if all(not rest.strip() for rest in lines[number:]):
                logger.warning("%s:%d: dropping a torn last line (%d characters; the run was killed while writing "
                               "it)", path, number, len(line))
                break
            raise MetricsError(f"{path}:{number}: not a JSON line ({exc}); repair or delete that line") from exc
    return rows


def _line(row: Mapping[str, Any]) -> str:
    return json.dumps(_plain(row), allow_nan=False) + "\n"


def _plain(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its JSON spelling as a string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _restore(obj: dict[str, Any]) -> dict[str, Any]:
    """json's object hook: the strings :func:`_plain` wrote back to floats (nested objects get their own call)."""
    return {k: _restored(v) for k, v in obj.items()}


def _restored(value: Any) -> Any:
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, list):
        return [_restored(v) for v in value]
    return value
