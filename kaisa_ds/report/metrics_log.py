"""Reading JSONL logs (metrics.jsonl) written by runs that may have been killed mid-write.

One reader for every consumer: the pretraining resume, the mission report, the benchmarks and
``python -m kaisa_ds.report``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class MetricsError(ValueError):
    """A JSONL log is damaged in a way a resume cannot repair; the message names the file and line."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file (none when it does not exist). A torn last line (the process was killed mid-write)
    is dropped with a warning, since the step it belongs to is redone after a resume; a bad line before it is an
    error naming the file and line. The one reader of metrics files (curves, the mission's report, benchmarks)."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if all(not rest.strip() for rest in lines[number:]):
                logger.warning("%s:%d: dropping a torn last line (%d characters; the run was killed while writing "
                               "it)", path, number, len(line))
                break
            raise MetricsError(f"{path}:{number}: not a JSON line ({exc}); repair or delete that line") from exc
    return rows
