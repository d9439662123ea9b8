"""Atomic file writes: a crash (kill, power loss, full disk) leaves the old file or the new one, never a torn one.

The one home of the pattern: write a hidden temporary file in the same folder (a rename is atomic only within one
file system), fsync it, rename it over the target, then fsync the folder so the rename itself survives a power
loss. Used by the K-FAC shards, bert_pretrain's checkpoints, data and logs, and the main job's stage record.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def replace_atomic(path: Path, write: Callable[[Path], object]) -> int:
    """Replace ``path`` with what ``write(tmp)`` writes to a temporary path (for writers that take a path, such as
    ``torch.save``); returns the final size in bytes. The folder is created if missing; the temporary file is
    removed if anything fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_folder(path.parent)
    return path.stat().st_size


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step: readers see the old file or the new one, never a torn one."""
    replace_atomic(path, lambda tmp: tmp.write_bytes(data))


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable. Some file systems (and platforms without O_DIRECTORY) cannot fsync a
    folder; the rename is still atomic there, only its durability after a power loss is the file system's."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        logger.debug("cannot open %s to fsync it (%s)", folder, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        logger.debug("cannot fsync folder %s (%s)", folder, exc)
    finally:
        os.close(fd)
