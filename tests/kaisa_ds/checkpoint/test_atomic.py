"""kaisa_ds.checkpoint.atomic: a failed write leaves the old file; a finished one is durable (file and folder
fsynced, in that order around the rename)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kaisa_ds.checkpoint import atomic
from kaisa_ds.checkpoint.atomic import replace_atomic, write_atomic


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """("file" | "folder" | "rename", path) in the order the write did them."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def spy_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(("rename", str(dst)))
        replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", spy_fsync)
    monkeypatch.setattr(atomic.os, "replace", spy_replace)
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names fds through /proc")
def test_the_file_is_synced_before_the_rename_and_the_folder_after(tmp_path: Path, synced: list) -> None:
    target = tmp_path / "sub" / "record.json"
    write_atomic(target, b"{}")
    assert target.read_bytes() == b"{}"
    kinds = [k for k, _ in synced]
    assert kinds == ["file", "rename", "folder"]
    assert Path(synced[0][1]).parent == target.parent and synced[0][1] != str(target)  # a temporary beside it
    assert synced[2][1] == str(target.parent)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "shard.pt"
    target.write_bytes(b"old")

    def torn(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        replace_atomic(target, torn)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard.pt"]


def test_the_size_written_is_returned(tmp_path: Path) -> None:
    assert replace_atomic(tmp_path / "x", lambda tmp: tmp.write_text("abc")) == 3
