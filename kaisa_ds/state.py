"""Saving and restoring the complete K-FAC state (factors, decompositions, counters, structure).

Decompositions live on their assigned ranks, so :func:`export_state` gathers them (one broadcast
per source rank) and every rank returns the same dictionary. :func:`validate_state` checks a state
completely (version, keys, shapes, finite values) before :meth:`KFACPreconditioner.load_state_dict`
changes anything, so a corrupt state is refused by name and leaves the preconditioner as it was; a
non-finite decomposition is dropped with a warning and recomputed from its (finite) factor.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from kaisa_ds.decomposition.decompose import layout
from kaisa_ds.distributed.collectives import broadcast_flat
from kaisa_ds.step import placeholder, with_flag
from kaisa_ds.structure import layer_info

if TYPE_CHECKING:
    from kaisa_ds.preconditioner import KFACPreconditioner

logger = logging.getLogger(__name__)
STATE_VERSION = 1
REQUIRED = ("version", "steps", "skipped_windows", "discovered", "layers", "factors", "decompositions",
            "compute_method")


def _gather_decompositions(p: KFACPreconditioner) -> dict[str, list[torch.Tensor]]:
    s = p.structure
    if s is None:
        return {}
    facs = s.factors()
    out: dict[str, list[torch.Tensor]] = {}
    for src in range(p.world):
        names = [f for f in facs if s.decomposes(f, src)]
        if not names:
            continue
        parts = [with_flag(p, s, f) if src == p.rank else placeholder(p, s, f) for f in names]
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


def export_state(p: KFACPreconditioner) -> dict[str, Any]:
    """The state as plain tensors on CPU; identical on every rank."""
    s = p.structure
    return {
        "version": STATE_VERSION,
        "steps": p.steps,
        "skipped_windows": p.skipped_windows,
        "discovered": p.discovered_info,
        "layers": layer_info(s.layers) if s is not None else None,
        "factors": {n: f.export() for n, f in (s.factors() if s is not None else {}).items()},
        "decompositions": _gather_decompositions(p),
        "compute_method": p.config.method.value,
    }


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


def validate_state(state: Any, *, discovered: dict[str, dict[str, Any]], diagonal: dict[str, bool],
                   method: str) -> list[str]:
    """Raise ValueError naming the first problem of a state; return the decompositions that must be dropped
    (non-finite ones, recomputed from their factors)."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        got = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a kaisa_ds K-FAC state: expected version {STATE_VERSION}, got {got!r}")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise ValueError(f"K-FAC state lacks the key(s) {missing}; it is truncated or not from kaisa_ds")
    check_same_model(discovered, state["discovered"])
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
    if state["compute_method"] != method:
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
