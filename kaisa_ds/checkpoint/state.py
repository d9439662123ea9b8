"""Saving and restoring the complete K-FAC state (factors, decompositions, counters, structure).

Decompositions live on their assigned ranks, so :func:`export_state` gathers them (one broadcast
per source rank) and every rank returns the same dictionary. The sharded path (:mod:`kaisa_ds.checkpoint.shards`)
avoids that gather: :func:`owned_state` is what one rank alone writes (the factors it decomposes and their
decompositions) and :func:`adopt_decompositions` installs the decompositions a rank read back.
:func:`validate_state` checks a state completely (version, keys, shapes, finite values) before
:meth:`KFACPreconditioner.load_state_dict` changes anything, so a corrupt state is refused by name and
leaves the preconditioner as it was; a non-finite decomposition is dropped with a warning and recomputed
from its (finite) factor.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from kaisa_ds.decomposition.decompose import Decomposition, from_tensors, layout
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


def state_header(p: KFACPreconditioner) -> dict[str, Any]:
    """Everything of the state but its tensors (counters, structure, method): small, identical on every rank."""
    s = p.structure
    return {
        "version": STATE_VERSION,
        "steps": p.steps,
        "skipped_windows": p.skipped_windows,
        "discovered": p.discovered_info,
        "layers": layer_info(s.layers) if s is not None else None,
        "compute_method": p.config.method.value,
    }


def export_state(p: KFACPreconditioner) -> dict[str, Any]:
    """The state as plain tensors on CPU; identical on every rank."""
    s = p.structure
    return {
        **state_header(p),
        "factors": {n: f.export() for n, f in (s.factors() if s is not None else {}).items()},
        "decompositions": _gather_decompositions(p),
    }


def owned_state(p: KFACPreconditioner) -> dict[str, Any]:
    """This rank's share, on CPU, with no communication: the factors it decomposes (each factor has exactly one
    such rank, so the shares of all ranks hold every factor once) and the decompositions it computed of them."""
    s = p.structure
    if s is None:
        return {"factors": {}, "decompositions": {}}
    mine = [f for f in s.factors() if s.decomposes(f, p.rank)]
    return {"factors": {f: s.factors()[f].export() for f in mine},
            "decompositions": {f: [t.detach().cpu().clone() for t in p.decompositions[f].tensors()]
                               for f in mine if f in p.decompositions}}


def _dims_of(p: KFACPreconditioner) -> tuple[dict[str, int], dict[str, bool]]:
    facs = p.structure.factors() if p.structure is not None else {}
    return {n: f.dim for n, f in facs.items()}, {n: f.diagonal for n, f in facs.items()}


def adopt_decompositions(p: KFACPreconditioner, found: dict[str, list[torch.Tensor]], *, source: str) -> None:
    """Install decompositions read back for the factors this rank holds (after :meth:`load_state_dict` of the
    rest); one that is missing, misshapen or not finite is recomputed from its factor at the next step, on every
    rank alike (a collective under torch.distributed). ``source`` names the files in warnings."""
    s = p.structure
    if s is None:
        return
    dims, diagonal = _dims_of(p)
    method = p.config.method.value
    device = next(iter(s.layers.values())).helper.weight.device
    kept: dict[str, Decomposition] = {}
    for name, tensors in found.items():
        if name in dims and s.holds(name, p.rank) and _usable(name, tensors, dim=dims[name],
                                                               diagonal=diagonal[name], method=method, source=source):
            kept[name] = from_tensors([t.to(device=device, dtype=p.config.inv_dtype, copy=True)  # type: ignore[arg-type]
                                       for t in tensors], method=method)
    p.decompositions = kept
    p.grouped.invalidate()
    missing = any(f.has_value and s.holds(n, p.rank) and n not in kept for n, f in s.factors().items())
    if p.world > 1:  # a decomposition step is a collective: every rank must agree to run one
        flag = torch.tensor([float(missing)], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        missing = bool(flag.item() > 0)
    p.needs_decomposition = missing


def _usable(name: str, tensors: list[torch.Tensor], *, dim: int, diagonal: bool, method: str, source: str) -> bool:
    want = layout(dim, diagonal=diagonal, method=method)
    if [tuple(t.shape) for t in tensors] != want:
        logger.warning("K-FAC state %s: the decomposition of %s has shapes %s, expected %s; it is recomputed from "
                       "its factor", source, name, [tuple(t.shape) for t in tensors], want)
        return False
    if not all(bool(torch.isfinite(t.float()).all()) for t in tensors):
        logger.warning("K-FAC state %s: the decomposition of %s is not finite; it is recomputed from its factor",
                       source, name)
        return False
    return True


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
    diagonal = {info["a"]: info["type"] == "Embedding" for info in discovered.values()}
    return validate_state(state, discovered=discovered, diagonal=diagonal, method=str(state["compute_method"]))


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
