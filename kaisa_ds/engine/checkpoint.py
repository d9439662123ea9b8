"""K-FAC state inside DeepSpeed checkpoints, sharded: each rank writes its own share next to DeepSpeed's files.

``engine.save_checkpoint`` writes DeepSpeed's files, then every rank its K-FAC shard and rank 0 the shard index
(:mod:`kaisa_ds.checkpoint.shards`: ``<tag>/kfac_rank{r}_of_{W}.pt`` and ``<tag>/kfac_meta.json``, the index last).
DeepSpeed's ``client_state`` (written by data-parallel rank 0 into its model-states file) carries only a small record
(``kaisa_ds_kfac_shards``: world size, step) that says the shards belong to the checkpoint, so a tag whose shards
were never completed is refused rather than silently resumed without K-FAC state. ``load_checkpoint`` restores
the shards at the current world size.

Checkpoints written before the sharded format (the whole gathered state in ``client_state["kaisa_ds_kfac"]``)
still load. Both calls are collectives: run them on all ranks.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch

from kaisa_ds.checkpoint.shards import META, check_shards, load_shards, save_shards
from kaisa_ds.checkpoint.state import validate_saved_state
from kaisa_ds.preconditioner import KFACPreconditioner

logger = logging.getLogger(__name__)
CLIENT_KEY = "kaisa_ds_kfac"  # the previous format: the gathered state itself
SHARDS_KEY = "kaisa_ds_kfac_shards"  # the sharded format: a record that the tag's K-FAC shards belong to it


def wrap_checkpointing(engine: Any, kfac: KFACPreconditioner) -> None:
    """Make ``engine.save_checkpoint`` / ``engine.load_checkpoint`` carry the complete K-FAC state."""
    save, load = engine.save_checkpoint, engine.load_checkpoint

    @functools.wraps(save)  # DeepSpeed's signature: the HF Trainer probes it for exclude_frozen_parameters
    def save_checkpoint(save_dir: str, tag: Any = None, client_state: dict[str, Any] | None = None,
                        *args: Any, **kwargs: Any) -> Any:
        tag = tag if tag is not None else f"global_step{engine.global_steps}"  # DeepSpeed's own default
        state = dict(client_state or {})
        state[SHARDS_KEY] = {"world": kfac.world, "steps": kfac.steps, "index": META}
        result = save(save_dir, tag, state, *args, **kwargs)
        save_shards(kfac, Path(save_dir) / str(tag))
        return result

    @functools.wraps(load)
    def load_checkpoint(load_dir: str, tag: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            path, client_state = load(load_dir, tag, *args, **kwargs)
        except Exception as exc:  # DeepSpeed's ZeRORuntimeException is not a RuntimeError
            if "DP world size" in str(exc):  # ZeRO-1/2 partitions saved at another world size
                raise ValueError(f"checkpoint {load_dir} (tag {tag}) cannot be resumed at this world size: "
                                 f"{str(exc).splitlines()[0]} Resume it on the number of ranks it was saved with; "
                                 "the K-FAC state itself re-shards to any world size, and so do ZeRO-0 "
                                 "checkpoints") from exc
            if not isinstance(exc, RuntimeError) or "Error(s) in loading state_dict" not in str(exc):
                raise
            raise ValueError(f"checkpoint {load_dir} (tag {tag}) does not fit this model: it was saved from a "
                             f"different model. {str(exc).splitlines()[0]}") from exc
        if path is None:
            return path, client_state
        client_state = client_state if client_state is not None else {}
        record, gathered = client_state.pop(SHARDS_KEY, None), client_state.pop(CLIENT_KEY, None)
        if record is not None:
            load_shards(kfac, Path(path).parent, steps=int(record["steps"]))  # its errors name the file
        elif gathered is not None:  # written before the sharded format
            try:
                kfac.load_state_dict(gathered)
            except ValueError as exc:  # name the file: a user must know which checkpoint is bad
                raise ValueError(f"checkpoint {path}: {exc}") from exc
        else:
            logger.warning("checkpoint %s has no K-FAC state; K-FAC starts from scratch", path)
        return path, client_state

    engine.save_checkpoint = save_checkpoint
    engine.load_checkpoint = load_checkpoint


def check_saved_state(model_states: Path) -> str | None:
    """Why the K-FAC state of the checkpoint whose DeepSpeed model-states file is ``model_states`` cannot be
    loaded (naming the file and the factor or key), or None when it is sound or absent. Checks the shards next to
    it (present, of their recorded sizes, readable, finite, fitting the saved layers) or, for a checkpoint of the
    previous format, the state inside the file. Reads files only, with no model or engine, so a resume can pick
    an older checkpoint instead of failing on this one."""
    try:
        saved = torch.load(model_states, map_location="cpu", weights_only=False, mmap=True)
    except Exception as exc:  # a corrupt file: torch raises many kinds
        return f"{model_states} cannot be read ({exc})"
    if not isinstance(saved, dict):
        return None
    if saved.get(SHARDS_KEY) is not None:
        return check_shards(model_states.parent)
    state = saved.get(CLIENT_KEY)
    if state is None:
        return None
    try:
        validate_saved_state(state)
    except (ValueError, KeyError, TypeError) as exc:
        return f"{model_states}: the K-FAC state ('{CLIENT_KEY}') is not loadable: {exc}"
    return None
