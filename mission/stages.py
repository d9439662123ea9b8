"""A record of the main job's finished stages (``stages.json``), so a rerun after a crash redoes only what is left."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kaisa_ds.checkpoint.atomic import write_atomic
from mission.jobs import launch

logger = logging.getLogger("mission")


def file_digest(paths: Sequence[Path]) -> str:
    """A digest of the files' contents: a stage reading them must rerun when they change (same paths or not)."""
    digest = hashlib.sha1()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


class StageRecord:
    """Each stage is keyed by name and remembered with its exact arguments and inputs.

    ``inputs`` identify what a stage reads besides its arguments: a :func:`file_digest` of its data, or the
    :meth:`token` of the stage that wrote its input (a new token each time that stage runs, so everything
    downstream of a rerun stage runs again). A stage whose arguments and inputs match a finished record (and
    whose output is still there) is skipped; an unfinished one with the same arguments and inputs is resumed
    when the stage supports it (pretraining's ``--resume``); anything else runs from the start.
    ``fresh=True`` ignores the record.
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
            inputs: Sequence[str] = (), resume_flag: str | None = None, restart_flag: str | None = None) -> float:
        """Run (or skip, or resume) ``module`` under the launcher; returns its wall seconds (recorded if skipped).

        ``restart_flag`` is passed when the stage starts over (its output folder may hold an older run, which
        the stage refuses to replace without being told)."""
        rec = self.stages.get(key)
        same = rec is not None and rec.get("args") == args and rec.get("inputs") == list(inputs)
        if same and rec is not None and rec.get("done") and output.exists():
            logger.info("%s: already done (%s); skipped (--fresh to redo)", key, output)
            return float(rec.get("seconds", 0.0))
        if same and resume_flag:
            run_args = args + [resume_flag]
        else:
            run_args = args + [restart_flag] if restart_flag else args
        self._save(key, {"args": args, "inputs": list(inputs), "done": False})
        seconds = launch(module, run_args, ranks=ranks, log=log)
        self._save(key, {"args": args, "inputs": list(inputs), "done": True, "seconds": seconds,
                         "token": f"{key}@{time.time_ns()}"})
        return seconds

    def token(self, key: str) -> str:
        """Identifies the last finished run of ``key``: pass it as an input of the stages that read its output."""
        return str(self.stages.get(key, {}).get("token", ""))

    def _save(self, key: str, value: dict[str, Any]) -> None:
        self.stages[key] = value
        write_atomic(self.path, json.dumps(self.stages, indent=1).encode())  # a crash keeps the last whole record
