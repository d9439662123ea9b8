"""Writing files so that a crash never leaves one half-written: a temporary file, fsync, then os.replace."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step: readers see the old file or the new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write ``data`` atomically unless ``path`` already holds exactly it (its mtime then stays); True if written."""
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return False
    write_atomic(path, data)
    return True
