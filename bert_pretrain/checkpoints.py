"""Periodic checkpoints through ``engine.save_checkpoint``, with what an exact resume needs besides the engine.

DeepSpeed saves the model, optimizer and LR scheduler (and kaisa_ds adds the K-FAC state: one shard per
rank and an index, ``kfac_rank{r}_of_{W}.pt`` and ``kfac_meta.json`` in the same tag, see
:mod:`kaisa_ds.checkpoint.shards`).
Here the client state adds the step and data position, and each rank writes its own RNG state (dropout masks
differ per rank, and DeepSpeed's client state is written by rank 0 only).

A checkpoint counts only once it is complete: after every rank has written its files (a barrier), rank 0
writes ``<tag>/complete.json`` last, listing each file with its size, and what the run was trained on (the
vocabulary file itself and the data's digests: the "pins"). Then rank 0 points ``latest`` at it (DeepSpeed
would write ``latest`` before the other ranks' files and this marker exist); a resume does not trust ``latest``
anyway, since older runs and other tools write it early. A resume takes the newest tag whose marker is there
and whose files are all intact (present, of the recorded size, and readable zip archives; the K-FAC shards
also complete, finite and fitting their index: ``check_saved_state``), warning about each
newer one it skips; rank 0 decides and broadcasts the tag, so every rank loads the same one.
"""

from __future__ import annotations

import io
import json
import logging
import random
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bert_pretrain import faults
from kaisa_ds.checkpoint.atomic import write_atomic
from kaisa_ds.engine.checkpoint import check_saved_state

logger = logging.getLogger(__name__)
MARKER = "complete.json"
VOCAB = "vocab.txt"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or none can be resumed from; the message names the file and the fix."""


@dataclass(frozen=True)
class Intact:
    """A complete checkpoint chosen for a resume."""

    folder: Path
    step: int
    pins: dict[str, Any]


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tags(folder: Path) -> list[Path]:
    """``step<N>`` folders, newest first."""
    tags = [p for p in folder.glob("step*") if p.is_dir() and p.name[4:].isdigit()]
    return sorted(tags, key=lambda p: int(p.name[4:]), reverse=True)


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_marker(tag_dir: Path, *, step: int, world: int, pins: dict[str, Any]) -> None:
    """Mark ``tag_dir`` complete: every file in it with its size, and the pins (written last, atomically)."""
    files = {str(p.relative_to(tag_dir)): p.stat().st_size for p in sorted(tag_dir.rglob("*"))
             if p.is_file() and p.name != MARKER and not p.name.startswith(".")}
    marker = {"step": step, "world_size": world, "files": files, "pins": pins}
    write_atomic(tag_dir / MARKER, json.dumps(marker, indent=1).encode())


def _free_space(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free there"
    except OSError:
        return "free space unknown"


def save(engine: Any, folder: Path, *, step: int, consumed: int, rank: int, world: int, keep: int = 0,
         pins: dict[str, Any], vocab: Path) -> None:
    """Checkpoint ``step<N>`` (a collective: every rank calls it), completed by rank 0's marker; then rank 0
    deletes all but the ``keep`` newest complete checkpoints (0: keep all). A failed write (a full disk) raises
    :class:`CheckpointError`; the previous complete checkpoint stays the one a resume takes."""
    from deepspeed import comm as dist

    tag = f"step{step}"
    tag_dir = folder / tag
    try:
        if rank == 0:
            (tag_dir / MARKER).unlink(missing_ok=True)  # an older save of this tag is no longer complete
        dist.barrier()
        engine.save_checkpoint(str(folder), tag=tag, client_state={"step": step, "consumed_micro_batches": consumed,
                                                                   "pins": pins}, save_latest=False)
        faults.inject("save", rank=rank, step=step)
        write_atomic(tag_dir / f"rng_rank{rank:03d}.pt", _torch_bytes(rng_state()))
        if rank == 0:
            shutil.copyfile(vocab, tag_dir / VOCAB)
        dist.barrier()  # every rank's files are written
        if rank == 0:
            write_marker(tag_dir, step=step, world=world, pins=pins)
            write_atomic(folder / "latest", tag.encode())  # for DeepSpeed's own tools; only ever a complete tag
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as RuntimeError("... iostream error")
        raise CheckpointError(f"saving checkpoint {tag_dir} failed: {exc} ({_free_space(folder)}). It is left "
                              f"incomplete (no {MARKER}) and a --resume will skip it; free space (or fix the folder) "
                              "and run again with --resume") from exc
    if rank == 0 and keep > 0:
        complete = [t for t in _tags(folder) if (t / MARKER).is_file()]
        for old in complete[keep:]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in _tags(folder):  # incomplete tags older than the newest complete one are never resumed
            if stale not in complete and int(stale.name[4:]) < step:
                shutil.rmtree(stale, ignore_errors=True)


def problem(tag_dir: Path, *, world: int) -> str | None:
    """Why ``tag_dir`` cannot be resumed from (naming the file), or None when it is intact."""
    marker = tag_dir / MARKER
    if not marker.is_file():
        return (f"{marker} is missing: the save did not finish (or the checkpoint predates completion markers; "
                "such a checkpoint cannot be checked and is not resumed)")
    try:
        record = json.loads(marker.read_text())
        files: dict[str, int] = dict(record["files"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"{marker} is unreadable ({exc})"
    for name, size in files.items():
        path = tag_dir / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes, {size} were written: truncated or overwritten"
        if path.suffix == ".pt":
            try:
                with zipfile.ZipFile(path) as archive:
                    bad = archive.testzip()
            except (zipfile.BadZipFile, OSError) as exc:
                return f"{path} is not a readable torch file ({exc})"
            if bad is not None:
                return f"{path} is corrupt (checksum of its member {bad} fails)"
            if path.name.endswith("model_states.pt"):  # names the K-FAC shards (or holds an old state): check them
                why = check_saved_state(path)
                if why is not None:
                    return why
    if int(record.get("world_size", world)) != world:
        logger.warning("%s was saved by %s ranks, this run has %d: dropout masks will differ from an uninterrupted "
                       "run", tag_dir, record.get("world_size"), world)
    return None


def newest_intact(folder: Path, *, world: int) -> Intact | None:
    """The newest complete, intact checkpoint in ``folder`` (warning about each newer one skipped); None when
    there is no checkpoint at all. Reads files only, so it runs on one rank and the choice is broadcast."""
    tags = _tags(folder)
    skipped: list[str] = []
    for tag_dir in tags:
        why = problem(tag_dir, world=world)
        if why is None:
            if skipped:
                logger.warning("--resume: falling back to %s, the newest intact checkpoint", tag_dir)
            record = json.loads((tag_dir / MARKER).read_text())
            return Intact(tag_dir, int(record["step"]), dict(record.get("pins", {})))
        logger.warning("--resume: skipping checkpoint %s: %s", tag_dir.name, why)
        skipped.append(why)
    if tags:
        raise CheckpointError(f"--resume: no intact checkpoint in {folder}: " + "; ".join(skipped)
                              + ". Start again without --resume (in a new --output, or after deleting this one)")
    return None


def load(engine: Any, chosen: Intact, *, rank: int) -> tuple[int, int]:
    """Restore ``chosen`` into ``engine`` and this rank's RNG; returns (step, consumed micro-batches)."""
    folder, tag = chosen.folder.parent, chosen.folder.name
    try:
        path, client = engine.load_checkpoint(str(folder), tag=tag)
    except (RuntimeError, ValueError, OSError, EOFError, KeyError) as exc:  # kaisa_ds's K-FAC state checks too
        raise CheckpointError(f"--resume: loading checkpoint {chosen.folder} failed: {exc}") from exc
    if path is None:
        raise CheckpointError(f"--resume: DeepSpeed could not load checkpoint {chosen.folder} (see its log above)")
    rng_file = chosen.folder / f"rng_rank{rank:03d}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        logger.warning("%s is missing (saved with another number of ranks?): dropout masks will differ from an "
                       "uninterrupted run", rng_file)
    return int(client["step"]), int(client["consumed_micro_batches"])
