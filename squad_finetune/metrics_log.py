"""Append-only JSON-lines metrics file (one object per line), written by rank 0 only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsLog:
    """``write(event=..., **fields)`` appends one line; a no-op on ranks other than 0."""

    def __init__(self, path: Path, *, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("", encoding="utf-8")

    def write(self, *, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = {"event": event, **{k: _plain(v) for k, v in fields.items()}}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats become strings ("nan", "inf") instead of invalid JSON tokens."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
