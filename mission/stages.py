"""A record of the main job's finished stages (``stages.json``), so a rerun after a crash redoes only what is left."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from mission.jobs import launch

logger = logging.getLogger("mission")


class StageRecord:
    """Each stage is keyed by name and remembered with its exact arguments.

    A stage whose arguments match a finished record (and whose output is still there) is skipped; an unfinished
    one with the same arguments is resumed when the stage supports it (pretraining's ``--resume``); anything else
    runs from the start. ``fresh=True`` ignores the record.
    """

    def __init__(self, path: Path, *, fresh: bool) -> None:
        self.path = path
        self.stages: dict[str, dict[str, Any]] = {}
        if path.is_file() and not fresh:
            try:
                self.stages = json.loads(path.read_text())
            except json.JSONDecodeError:
                logger.warning("%s is unreadable; every stage runs again", path)

    def run(self, key: str, module: str, args: list[str], *, output: Path, log: Path, ranks: int,
            resume_flag: str | None = None) -> float:
        """Run (or skip, or resume) ``module`` under the launcher; returns its wall seconds (recorded if skipped)."""
        rec = self.stages.get(key)
        same = rec is not None and rec.get("args") == args
        if same and rec is not None and rec.get("done") and output.exists():
            logger.info("%s: already done (%s); skipped (--fresh to redo)", key, output)
            return float(rec.get("seconds", 0.0))
        run_args = args + [resume_flag] if same and resume_flag else args
        self._save(key, {"args": args, "done": False})
        seconds = launch(module, run_args, ranks=ranks, log=log)
        self._save(key, {"args": args, "done": True, "seconds": seconds})
        return seconds

    def _save(self, key: str, value: dict[str, Any]) -> None:
        self.stages[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.stages, indent=1))
        tmp.replace(self.path)
