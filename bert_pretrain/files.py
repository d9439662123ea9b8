"""Writing a file only when its content changes, so a rerun keeps its mtime (and what depends on it stays valid)."""

from __future__ import annotations

from pathlib import Path

from kaisa_ds.checkpoint.atomic import write_atomic


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write ``data`` atomically unless ``path`` already holds exactly it (its mtime then stays); True if written."""
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return False
    write_atomic(path, data)
    return True
