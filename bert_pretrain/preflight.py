"""Cheap checks of the command line's files and flags, run before anything heavy (data preparation, the
engine), so a wrong path fails in seconds with a message naming the flag instead of after minutes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from argparse import Namespace
from pathlib import Path
from typing import Any

from bert_pretrain.data.errors import DataError
from bert_pretrain.data.sources import resolve
from bert_pretrain.data.tokenizer import vocab_tokens

logger = logging.getLogger(__name__)


def check_writable(folder: Path, *, flag: str) -> None:
    """Create ``folder`` if needed and prove a file can be written in it."""
    if folder.exists() and not folder.is_dir():
        raise DataError(f"{flag} {folder} is a file, not a folder; give a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise DataError(f"{flag} {folder} is not writable ({exc.strerror or exc}); choose another folder or fix "
                        "its permissions") from exc


def check_args(args: Namespace) -> None:
    """The flags' files exist and are what they claim; phase 2 has weights to start from."""
    if args.phase == 2 and args.init_checkpoint is None and not args.from_scratch:
        raise DataError("--phase 2 without --init-checkpoint would train from random weights: pass "
                        "--init-checkpoint <phase-1 output>/final, or --from-scratch if that is what you want")
    if args.init_checkpoint is not None and not (args.init_checkpoint / "config.json").is_file():
        raise DataError(f"--init-checkpoint {args.init_checkpoint}: no model there (no config.json); give the "
                        "final/ folder of a phase-1 run")
    if not args.config.is_file():
        raise DataError(f"--config {args.config} does not exist; give a DeepSpeed JSON config such as "
                        "ds_configs/bert_tiny_phase1.json")
    if args.vocab is not None:
        vocab_tokens(args.vocab)
    if args.data:
        resolve(args.data, text_column=args.text_column, data_split=args.data_split)  # formats, columns, splits
    check_writable(args.output, flag="--output")
    if args.data_cache is not None:
        check_writable(args.data_cache, flag="--data-cache")


def finished_summary(out: Path, *, max_steps: int) -> dict[str, Any] | None:
    """The summary of a run in ``out`` that already finished ``max_steps`` steps (None: not finished), so a
    resume leaves its results alone; a finished run of another length is refused, not silently redone."""
    path = out / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = dict(json.loads(path.read_text()))
    except ValueError:
        logger.warning("%s is unreadable; the run is treated as unfinished", path)
        return None
    if summary.get("steps") != max_steps:
        raise DataError(f"--resume: {out} holds a run that finished {summary.get('steps')} steps, but --max-steps "
                        f"is {max_steps}; its schedule cannot be extended. Use another --output for a new run")
    return summary


def check_fresh_output(out: Path, *, overwrite: bool) -> None:
    """Refuse to start over in a folder that holds a run's results, unless ``--overwrite`` says so (then its
    summary and checkpoints go, so a later --resume cannot mix the two runs)."""
    held = [p for p in (out / "summary.json", out / "checkpoints") if p.exists()]
    if not held:
        return
    if not overwrite:
        raise DataError(f"--output {out} already holds a run ({', '.join(p.name for p in held)}); add --resume to "
                        "continue or keep it, --overwrite to start over, or choose another --output")
    for path in held:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
