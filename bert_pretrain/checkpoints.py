"""Periodic checkpoints through ``engine.save_checkpoint``, with what an exact resume needs besides the engine.

DeepSpeed saves the model, optimizer and LR scheduler (and kaisa_ds adds the K-FAC state). Here the client
state adds the step and data position, and each rank writes its own RNG state (dropout masks differ per rank,
and DeepSpeed's client state is written by rank 0 only). The RNG files are written *before* DeepSpeed updates
``latest``, so a run killed mid-save resumes from the previous complete checkpoint.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


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


def save(engine: Any, folder: Path, *, step: int, consumed: int, rank: int, keep: int = 0) -> None:
    """Checkpoint ``step<N>`` (a collective: every rank calls it); then rank 0 deletes all but the ``keep``
    newest checkpoints (0: keep all)."""
    tag = f"step{step}"
    (folder / tag).mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), folder / tag / f"rng_rank{rank:03d}.pt")
    engine.save_checkpoint(str(folder), tag=tag, client_state={"step": step, "consumed_micro_batches": consumed})
    if rank == 0 and keep > 0:
        tags = sorted((p for p in folder.glob("step*") if p.is_dir() and p.name[4:].isdigit()),
                      key=lambda p: int(p.name[4:]))
        for old in tags[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def load_latest(engine: Any, folder: Path, *, rank: int) -> tuple[int, int]:
    """(step, consumed micro-batches) of the latest checkpoint in ``folder``, restored into ``engine``;
    (0, 0) when there is none."""
    if not (folder / "latest").is_file():
        logger.warning("--resume: no checkpoint in %s yet; starting from step 0", folder)
        return 0, 0
    path, client = engine.load_checkpoint(str(folder))
    if path is None:
        raise RuntimeError(f"--resume: DeepSpeed could not load the checkpoint in {folder} (see its log above)")
    tag = (folder / "latest").read_text().strip()
    rng_file = folder / tag / f"rng_rank{rank:03d}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        logger.warning("%s is missing (saved with another number of ranks?): dropout masks will differ from an "
                       "uninterrupted run", rng_file)
    return int(client["step"]), int(client["consumed_micro_batches"])
