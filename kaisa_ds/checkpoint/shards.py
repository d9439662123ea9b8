"""Sharded K-FAC checkpoints: every rank writes only its share, any world size reads them back.

Layout inside one checkpoint folder (a DeepSpeed tag, next to DeepSpeed's own per-rank files)::

    kfac_rank{r:03d}_of_{W:03d}.pt   rank r's share (:func:`kaisa_ds.checkpoint.state.owned_state`): the factors it
                                     decomposes and their decompositions, every factor in exactly one shard; the
                                     adaptive eigenvalues' second moments of the layers whose G it decomposes
    kfac_meta.json                   written last, by rank 0, after every shard: counters, structure, method, the
                                     shards with their sizes and an index factor -> shard

Why: :meth:`KFACPreconditioner.state_dict` gathers every decomposition onto every rank (at BERT-Large about 6 GB of
host memory per rank and one 6 GB file per save); here a rank holds and writes about 1/world of it and nothing is
communicated but the index (one ``all_gather_object``).

Each file is written to a temporary name and renamed; rank 0 removes the old index before any shard is rewritten
and writes the new one only after every rank's shard, so an index always describes shards that are all complete
(a crash mid-save leaves a folder without index, which :func:`load_shards` and :func:`check_shards` refuse).
Loading reads the index, memory-maps the shards (a rank copies out only what it keeps: every factor, and the
decompositions of the factors it holds under the *current* world size); a decomposition that is missing or
unusable is recomputed from its factor at the next step. Assumes a file system every rank sees (as DeepSpeed's
own checkpoints do to load at another world size).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from kaisa_ds.checkpoint.atomic import replace_atomic
from kaisa_ds.checkpoint.restore import usable_decompositions
from kaisa_ds.checkpoint.scaling_state import KEY as SCALING_KEY
from kaisa_ds.checkpoint.scaling_state import usable_scaling
from kaisa_ds.checkpoint.state import (
    STATE_VERSION,
    StateOwner,
    owned_state,
    saved_method,
    state_header,
    validate_saved_state,
)
from kaisa_ds.decomposition.tensors import Decomposition


class ShardOwner(StateOwner, Protocol):
    """What the sharded save and load need of the preconditioner: :class:`StateOwner`'s reads, and the two calls
    through which it installs a loaded state itself."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def use_decompositions(self, decompositions: dict[str, Decomposition], *, recompute: bool) -> None: ...


logger = logging.getLogger(__name__)
META = "kfac_meta.json"
SCALING_INDEX = "scaling_index"  # layer -> the shard holding its adaptive second moments
FORMAT = "kaisa_ds.kfac_shards"
SHARD_GLOB = "kfac_rank*_of_*.pt"


def shard_name(rank: int, world: int) -> str:
    return f"kfac_rank{rank:03d}_of_{world:03d}.pt"


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _write_shard(p: StateOwner, folder: Path) -> tuple[str, int, dict[str, dict[str, Any]], dict[str, str]]:
    """This rank's shard; its CPU copies (the save's one large host allocation) are freed on return."""
    name = shard_name(p.rank, p.world)
    shard = {"format": FORMAT, "rank": p.rank, "world": p.world, **owned_state(p)}
    size = replace_atomic(folder / name, lambda tmp: torch.save(shard, tmp))
    index = {f: {"shard": name, "decomposition": f in shard["decompositions"]} for f in shard["factors"]}
    return name, size, index, {layer: name for layer in shard[SCALING_KEY]}


def save_shards(p: StateOwner, folder: Path) -> dict[str, Any]:
    """Write this rank's shard and (rank 0) the index into ``folder``; a collective: call it on every rank.
    Returns the index as written."""
    folder.mkdir(parents=True, exist_ok=True)
    if p.rank == 0:  # from here on the folder has no index until every new shard is complete
        (folder / META).unlink(missing_ok=True)
        for stale in folder.glob(SHARD_GLOB):
            if stale.name.split("_of_")[-1] != f"{p.world:03d}.pt":
                stale.unlink()  # left by a save at another world size: not this checkpoint's
    _barrier(p.world)
    entry = _write_shard(p, folder)
    entries: list[Any] = [None] * p.world
    if p.world > 1:  # also the barrier: every shard is written once rank 0 has all entries
        dist.all_gather_object(entries, entry)
    else:
        entries = [entry]
    meta = {**state_header(p), "format": FORMAT, "world": p.world, "shards": {n: s for n, s, _, _ in entries},
            "index": {f: info for _, _, idx, _ in entries for f, info in idx.items()},
            SCALING_INDEX: {layer: n for _, _, _, held in entries for layer, n in held.items()}}
    if p.rank == 0:
        replace_atomic(folder / META, lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))
    _barrier(p.world)  # no rank returns (and perhaps loads) before the index exists
    return meta


def read_meta(folder: Path) -> dict[str, Any]:
    """The index of ``folder``, with every shard it lists present at its recorded size; ValueError naming the
    file otherwise."""
    path = folder / META
    if not path.is_file():
        raise ValueError(f"{path} is missing: the K-FAC shards of this checkpoint are incomplete (a save interrupted "
                         "before every rank had written its shard); use an older checkpoint")
    try:
        meta = json.loads(path.read_text())
        shards = dict(meta["shards"])
        assert meta["format"] == FORMAT and isinstance(meta["index"], dict)
    except (ValueError, KeyError, TypeError, AssertionError) as exc:
        raise ValueError(f"{path} is not a readable K-FAC shard index ({exc!r})") from exc
    if meta.get("version") != STATE_VERSION:
        raise ValueError(f"{path}: K-FAC state version {meta.get('version')!r}, expected {STATE_VERSION}")
    for name, size in shards.items():
        shard = folder / name
        if not shard.is_file():
            raise ValueError(f"{shard} is missing (listed in {path}); use an older checkpoint")
        if shard.stat().st_size != size:
            raise ValueError(f"{shard} has {shard.stat().st_size} bytes, {size} were written: truncated or "
                             "overwritten; use an older checkpoint")
    return meta


def _open(path: Path) -> dict[str, Any]:
    """A shard, memory-mapped: its tensors are read from the file only when touched."""
    try:
        shard = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a corrupt file: torch raises many kinds
        raise ValueError(f"{path} is not a readable K-FAC shard ({exc})") from exc
    if not isinstance(shard, dict) or shard.get("format") != FORMAT:
        raise ValueError(f"{path} is not a K-FAC shard (no {FORMAT!r} format tag)")
    return shard


def assemble(folder: Path, meta: dict[str, Any], *, decompositions: Callable[[str], bool]) -> dict[str, Any]:
    """The state in :meth:`KFACPreconditioner.state_dict`'s format, with every factor and the decompositions
    ``decompositions(name)`` selects; tensors stay memory-mapped (nothing is copied here)."""
    state: dict[str, Any] = {k: meta[k] for k in ("version", "steps", "skipped_windows", "discovered", "layers",
                                                  "compute_method")}
    state["statistic_rows"] = meta.get("statistic_rows")  # absent in metas written before it
    state["cost_interval"] = meta.get("cost_interval")
    state["factors"], state["decompositions"] = {}, {}
    for name in meta["shards"]:
        shard = _open(folder / name)
        state["factors"].update(shard["factors"])
        state["decompositions"].update({f: ts for f, ts in shard["decompositions"].items() if decompositions(f)})
    missing = sorted(set(meta["index"]) - set(state["factors"]))
    if missing:
        raise ValueError(f"{folder / META} lists factors that no shard holds: {missing[:5]}")
    return state


def load_shards(p: ShardOwner, folder: Path, *, steps: int | None = None) -> None:
    """Restore ``folder``'s sharded state into ``p`` at this run's world size (a collective). ValueError naming the
    file when it is incomplete, belongs to another model or (``steps`` given) to another save (``p`` is unchanged
    then)."""
    meta = read_meta(folder)
    if steps is not None and meta["steps"] != steps:
        raise ValueError(f"{folder / META} is from K-FAC step {meta['steps']}, the checkpoint from step {steps}: the "
                         "index belongs to another save of this folder")
    try:
        p.load_state_dict(assemble(folder, meta, decompositions=lambda f: False))
    except ValueError as exc:
        raise ValueError(f"{folder / META}: {exc}") from exc
    s = p.structure
    holds = (lambda f: s.holds(f, p.rank)) if s is not None else (lambda f: False)
    wanted = {f for f, info in meta["index"].items() if info["decomposition"] and f in (s.factors() if s else {})
              and holds(f)}
    found: dict[str, list[torch.Tensor]] = {}
    for name in sorted({meta["index"][f]["shard"] for f in wanted}):  # only the shards this rank needs
        found.update({f: ts for f, ts in _open(folder / name)["decompositions"].items() if f in wanted})
    if saved_method(meta) is not p.config.method:
        found = {}  # saved as inverses, now eigen (or back): recomputed from the factors
    kept, recompute = usable_decompositions(p, found, source=str(folder))
    p.use_decompositions(kept, recompute=recompute)
    p.grouped.method.load_state(usable_scaling(p.structure, _scaling_entries(p, folder, meta), config=p.config,
                                               rank=p.rank, source=str(folder)))
    logger.info("K-FAC: loaded %d factors and %d of this rank's decompositions from %s (saved by %d ranks, loaded by "
                "%d)", len(meta["index"]), len(p.decompositions), folder, meta["world"], p.world)


def _scaling_entries(p: ShardOwner, folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The saved adaptive second moments of the layers this rank preconditions, read from their shards only."""
    s = p.structure
    where = meta.get(SCALING_INDEX) or {}  # absent in metas written before they were kept
    wanted = {layer for layer in where if s is not None and layer in s.layers and s.preconditions(layer, p.rank)}
    found: dict[str, Any] = {}
    for name in sorted({where[layer] for layer in wanted}):
        found.update({k: v for k, v in _open(folder / name).get(SCALING_KEY, {}).items() if k in wanted})
    return found


def check_shards(folder: Path) -> str | None:
    """Why ``folder``'s K-FAC shards cannot be loaded (naming the file and the factor), or None when they are
    sound. Reads the files only, with no model or process group."""
    try:
        meta = read_meta(folder)
        for name in meta["shards"]:
            shard = _open(folder / name)
            for factor, saved in shard["factors"].items():
                value = saved.get("value") if isinstance(saved, dict) else None
                if isinstance(value, torch.Tensor) and not bool(torch.isfinite(value.float()).all()):
                    return f"{folder / name}: K-FAC factor {factor} is not finite (corrupt checkpoint?)"
        validate_saved_state(assemble(folder, meta, decompositions=lambda f: True))
    except (ValueError, KeyError, TypeError) as exc:
        return f"{folder}: the K-FAC shards are not loadable: {exc}"
    return None
