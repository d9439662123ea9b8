"""Saving the complete K-FAC state (factors, decompositions, counters, structure) and checking a saved one.

Decompositions live on their assigned ranks, so :func:`export_state` gathers them (one broadcast
per source rank) and every rank returns the same dictionary. The sharded path (:mod:`kaisa_ds.checkpoint.shards`)
avoids that gather: :func:`owned_state` is what one rank alone writes (the factors it decomposes and their
decompositions). :func:`validate_state` checks a state completely (version, keys, shapes, finite values) before
anything is restored (:mod:`kaisa_ds.checkpoint.restore`), so a corrupt state is refused by name and leaves the
preconditioner as it was; a non-finite decomposition is dropped with a warning and recomputed from its (finite)
factor. These functions read the preconditioner through :class:`StateOwner` and change none of it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from kaisa_ds.checkpoint.scaling_state import KEY as SCALING_KEY
from kaisa_ds.checkpoint.scaling_state import ScalingOwner, gather_scaling, owned_scaling
from kaisa_ds.decomposition.decompose import layout
from kaisa_ds.decomposition.flagged import placeholder, with_flag
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.distributed.collectives import broadcast_flat
from kaisa_ds.enums import ComputeMethod, parse_count, parse_enum
from kaisa_ds.structure import layer_info

logger = logging.getLogger(__name__)
STATE_VERSION = 1
REQUIRED = ("version", "steps", "skipped_windows", "discovered", "layers", "factors", "decompositions",
            "compute_method")


class StateOwner(ScalingOwner, Protocol):
    """What saving reads of the preconditioner (the one owner of this state): :class:`ScalingOwner`'s and these."""

    @property
    def steps(self) -> int: ...

    @property
    def skipped_windows(self) -> int: ...

    @property
    def statistic_rows(self) -> int | None: ...

    @property
    def cost_interval(self) -> int | None: ...

    @property
    def decompositions(self) -> Mapping[str, Decomposition]: ...

    @property
    def discovered_info(self) -> dict[str, dict[str, Any]]: ...


def _gather_decompositions(p: StateOwner) -> dict[str, list[torch.Tensor]]:
    s = p.structure
    if s is None:
        return {}
    facs = s.factors()
    device = s.device
    shape = {"method": p.config.method, "dtype": p.config.inv_dtype_on(device), "device": device}
    out: dict[str, list[torch.Tensor]] = {}
    for src in range(p.world):
        names = [f for f in facs if s.decomposes(f, src)]
        if not names:
            continue
        parts = [with_flag(p.decompositions.get(f), facs[f].dim, diagonal=facs[f].diagonal, **shape)  # type: ignore[arg-type]
                 if src == p.rank else placeholder(facs[f].dim, diagonal=facs[f].diagonal, **shape)  # type: ignore[arg-type]
                 for f in names]
        flat = [t for ts in parts for t in ts]
        if p.world > 1:
            flat = broadcast_flat(flat, src=src, group=None)
        pos = 0
        for f, ts in zip(names, parts):
            got = flat[pos:pos + len(ts)]
            pos += len(ts)
            if float(got[-1]) > 0:
                out[f] = [t.detach().cpu().clone() for t in got[:-1]]
    return out


def state_header(p: StateOwner) -> dict[str, Any]:
    """Everything of the state but its tensors (counters, structure, method): small, identical on every rank."""
    s = p.structure
    return {
        "version": STATE_VERSION,
        "steps": p.steps,
        "skipped_windows": p.skipped_windows,
        "discovered": p.discovered_info,
        "layers": layer_info(s.layers) if s is not None else None,
        "compute_method": p.config.method.value,  # a string in the file: the format is unchanged
        "statistic_rows": p.statistic_rows,  # optional: states saved before it resolve "auto" again
        "cost_interval": p.cost_interval,  # optional: states saved before it time the decompositions again
    }


def export_state(p: StateOwner) -> dict[str, Any]:
    """The state as plain tensors on CPU; identical on every rank."""
    s = p.structure
    return {
        **state_header(p),
        "factors": {n: f.export() for n, f in (s.factors() if s is not None else {}).items()},
        "decompositions": _gather_decompositions(p),
        SCALING_KEY: gather_scaling(p),
    }


def owned_state(p: StateOwner) -> dict[str, Any]:
    """This rank's share, on CPU, with no communication: the factors it decomposes (each factor has exactly one
    such rank, so the shares of all ranks hold every factor once), the decompositions it computed of them and the
    adaptive second moments of the layers whose G factor it decomposes."""
    s = p.structure
    if s is None:
        return {"factors": {}, "decompositions": {}, SCALING_KEY: {}}
    mine = [f for f in s.factors() if s.decomposes(f, p.rank)]
    return {"factors": {f: s.factors()[f].export() for f in mine},
            "decompositions": {f: [t.detach().cpu().clone() for t in p.decompositions[f].tensors()]
                               for f in mine if f in p.decompositions},
            SCALING_KEY: owned_scaling(p)}


def check_same_model(current: dict[str, dict[str, Any]], saved: dict[str, dict[str, Any]]) -> None:
    missing, unexpected = sorted(set(saved) - set(current)), sorted(set(current) - set(saved))
    changed = sorted(n for n in set(saved) & set(current)
                     if (saved[n]["type"], saved[n]["a_dim"], saved[n]["g_dim"])
                     != (current[n]["type"], current[n]["a_dim"], current[n]["g_dim"]))
    if missing or unexpected or changed:
        raise ValueError(
            "K-FAC state does not match this model (was it saved from a different model or with different "
            f"skip_layers?): missing layers {missing[:5]}, unexpected layers {unexpected[:5]}, "
            f"layers with other shapes {changed[:5]}"
        )


def _factor_dims(saved_layers: dict[str, dict[str, Any]]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for name, info in saved_layers.items():
        dims[info["a"]] = int(info["a_dim"])
        dims[f"{name}.G"] = int(info["g_dim"])
    return dims


def validate_saved_state(state: Any) -> list[str]:
    """:func:`validate_state` of a saved state on its own terms (its own layers, their embedding A factors and its
    compute method), for checking a checkpoint without a model: raises ValueError, KeyError or TypeError."""
    discovered = state["discovered"]
    diagonal: dict[str, bool] = {}
    for name, info in discovered.items():  # states saved before 2026-12-02 lack the flags: only embeddings' A was
        diagonal[info["a"]] = bool(info.get("a_diagonal", info["type"] == "Embedding"))
        diagonal[f"{name}.G"] = bool(info.get("g_diagonal", False))
    return validate_state(state, discovered=discovered, diagonal=diagonal, method=saved_method(state))


def saved_method(state: Mapping[str, Any]) -> ComputeMethod:
    """The compute method a state (or a shard index) was saved with; ValueError when it names none."""
    return parse_enum(ComputeMethod, state["compute_method"], name="K-FAC state: compute_method")


def validate_state(state: Any, *, discovered: dict[str, dict[str, Any]], diagonal: dict[str, bool],
                   method: ComputeMethod) -> list[str]:
    """Raise ValueError naming the first problem of a state; return the decompositions that must be dropped
    (non-finite ones, recomputed from their factors)."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        got = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a kaisa_ds K-FAC state: expected version {STATE_VERSION}, got {got!r}")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise ValueError(f"K-FAC state lacks the key(s) {missing}; it is truncated or not from kaisa_ds")
    check_same_model(discovered, state["discovered"])
    parse_count("cost_interval", state.get("cost_interval"), allow_none=True,
                meaning="the steps between decompositions the cost rule set; the saved K-FAC state is corrupt")
    parse_count("statistic_rows", state.get("statistic_rows"), allow_none=True,
                meaning="rows one factor update takes in over every rank; the saved K-FAC state is corrupt")
    if state["layers"] is None:
        return []
    dims = _factor_dims(state["layers"])
    for name, saved in state["factors"].items():
        if name not in dims:
            raise ValueError(f"K-FAC state has a factor {name} that no saved layer uses")
        value = saved.get("value") if isinstance(saved, dict) else None
        if value is None:
            continue
        want = (dims[name],) if diagonal.get(name, False) else (dims[name], dims[name])
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != want:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"K-FAC state: factor {name} has shape {got}, expected {want}")
        scale = saved.get("scale")
        if not bool(torch.isfinite(value.float()).all()) or (
                isinstance(scale, torch.Tensor) and not bool(torch.isfinite(scale).all())):
            raise ValueError(f"K-FAC state: factor {name} is not finite (corrupt checkpoint?)")
    dropped: list[str] = []
    if saved_method(state) is not method:
        return dropped
    for name, tensors in state["decompositions"].items():
        if name not in dims:
            raise ValueError(f"K-FAC state has a decomposition of {name}, a factor no saved layer uses")
        want_shapes = layout(dims[name], diagonal=diagonal.get(name, False), method=method)
        if [tuple(t.shape) for t in tensors] != want_shapes:
            raise ValueError(f"K-FAC state: decomposition of {name} has shapes "
                             f"{[tuple(t.shape) for t in tensors]}, expected {want_shapes}")
        if not all(bool(torch.isfinite(t.float()).all()) for t in tensors):
            logger.warning("K-FAC state: the decomposition of %s is not finite; it is dropped and recomputed from "
                           "its factor at the next step", name)
            dropped.append(name)
    return dropped
