"""K-FAC state inside DeepSpeed checkpoints.

The state is replicated (every rank returns the same ``state_dict``), so it rides in DeepSpeed's
``client_state``, which only the data-parallel rank 0 writes; ``load_checkpoint`` hands it back on
every rank. ``state_dict`` is a collective, and so is ``save_checkpoint``: both run on all ranks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from kaisa_ds.preconditioner import KFACPreconditioner
from kaisa_ds.state import validate_state

logger = logging.getLogger(__name__)
CLIENT_KEY = "kaisa_ds_kfac"


def wrap_checkpointing(engine: Any, kfac: KFACPreconditioner) -> None:
    """Make ``engine.save_checkpoint`` / ``engine.load_checkpoint`` carry the complete K-FAC state."""
    save, load = engine.save_checkpoint, engine.load_checkpoint

    def save_checkpoint(save_dir: str, tag: Any = None, client_state: dict[str, Any] | None = None,
                        *args: Any, **kwargs: Any) -> Any:
        state = dict(client_state or {})
        state[CLIENT_KEY] = kfac.state_dict()
        return save(save_dir, tag, state, *args, **kwargs)

    def load_checkpoint(load_dir: str, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            path, client_state = load(load_dir, tag, *args, **kwargs)
        except RuntimeError as exc:
            if "Error(s) in loading state_dict" not in str(exc):
                raise
            raise ValueError(f"checkpoint {load_dir} (tag {tag}) does not fit this model: it was saved from a "
                             f"different model. {str(exc).splitlines()[0]}") from exc
        if path is None:
            return path, client_state
        state = (client_state or {}).pop(CLIENT_KEY, None)
        if state is None:
            logger.warning("checkpoint %s has no K-FAC state; K-FAC starts from scratch", path)
        else:
            try:
                kfac.load_state_dict(state)
            except ValueError as exc:  # name the file: a user must know which checkpoint is bad
                raise ValueError(f"checkpoint {path}: {exc}") from exc
        return path, client_state

    engine.save_checkpoint = save_checkpoint
    engine.load_checkpoint = load_checkpoint


def check_saved_state(model_states: Path) -> str | None:
    """Why the K-FAC state inside a DeepSpeed model-states file cannot be loaded (naming the file and the factor
    or key), or None when it is sound or absent. Reads the file only, with no model or engine, so a resume can
    pick an older checkpoint instead of failing on this one."""
    try:
        saved = torch.load(model_states, map_location="cpu", weights_only=False, mmap=True)
    except Exception as exc:  # a corrupt file: torch raises many kinds
        return f"{model_states} cannot be read ({exc})"
    state = saved.get(CLIENT_KEY) if isinstance(saved, dict) else None
    if state is None:
        return None
    try:
        discovered = state["discovered"]
        diagonal = {info["a"]: info["type"] == "Embedding" for info in discovered.values()}
        validate_state(state, discovered=discovered, diagonal=diagonal, method=str(state["compute_method"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"{model_states}: the K-FAC state ('{CLIENT_KEY}') is not loadable: {exc}"
    return None
