"""Where results go and how they look: the results folder, Markdown tables, the JSON file and the printout."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parents[1] / "results"


def write_json(data: dict[str, Any], path: Path) -> None:
    """``data`` as indented JSON (anything else as its ``str``), creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def publish(res: dict[str, Any], text: str, out: Path) -> None:
    """Print a benchmark's tables, write its JSON (settings, raw figures, machine) and say where it went."""
    print(text)
    write_json(res, out)
    print(f"\nwrote {out}")


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table (also readable as plain text); floats to 4 significant digits."""
    def cell(v: Any) -> str:
        if isinstance(v, bool) or v is None:
            return "" if v is None else str(v)
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
