"""Saving and restoring the complete K-FAC state (factors, decompositions, counters, structure).

Decompositions live on their assigned ranks, so :func:`export_state` gathers them (one broadcast
per source rank) and every rank returns the same dictionary; :func:`import_state` keeps the ones
this rank needs under the current (possibly different) world size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kaisa_ds.decomposition.decompose import Decomposition
from kaisa_ds.distributed.collectives import broadcast_flat
from kaisa_ds.layers import discover_layers

if TYPE_CHECKING:
    from kaisa_ds.preconditioner import KFACPreconditioner

STATE_VERSION = 1


def _layer_info(p: KFACPreconditioner, names: list[str]) -> dict[str, dict[str, Any]]:
    return {n: {"type": type(p.layers[n].module).__name__, "a_dim": p.layers[n].a.dim,
                "g_dim": p.layers[n].g.dim, "a": p.layers[n].a.name} for n in names}


def _gather_decompositions(p: KFACPreconditioner) -> dict[str, list[torch.Tensor]]:
    from kaisa_ds.step import _placeholder, _with_flag

    if p.assignment is None:
        return {}
    facs = p.factors()
    out: dict[str, list[torch.Tensor]] = {}
    for src in range(p.world):
        names = [f for f in facs if p.assignment.inverse_worker[f] == src]
        if not names:
            continue
        parts = [_with_flag(p, f, facs[f]) if src == p.rank else _placeholder(p, f) for f in names]
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
    facs = p.factors()
    return {
        "version": STATE_VERSION,
        "steps": p.steps,
        "skipped_windows": p.skipped_windows,
        "discovered": _layer_info(p, list(p.layers)) if p.assignment is None else p._discovered_info,
        "layers": _layer_info(p, list(p.layers)) if p.assignment is not None else None,
        "factors": {n: f.export() for n, f in facs.items()},
        "decompositions": _gather_decompositions(p),
        "compute_method": p.config.method.value,
    }


def _check_same_model(p: KFACPreconditioner, saved: dict[str, dict[str, Any]]) -> None:
    current = _layer_info(p, list(p.layers))
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


def import_state(p: KFACPreconditioner, state: dict[str, Any]) -> None:
    """Restore a state from :func:`export_state` (same model; any world size)."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not a kaisa_ds K-FAC state (expected version {STATE_VERSION})")
    p.capture.remove_all()
    p.layers = discover_layers(p.model, p.config)
    p.assignment = None
    _check_same_model(p, state["discovered"])
    p._discovered_info = _layer_info(p, list(p.layers))
    for name, layer in p.layers.items():
        p.capture.attach(name, layer.module)
    if state["layers"] is not None:
        saved = state["layers"]
        same_input = {n: next(m for m in saved if saved[m]["a"] == info["a"])
                      for n, info in saved.items() if not info["a"].startswith(f"{n}.")}
        p._pending_decompositions = {} if state["compute_method"] != p.config.method.value else {
            f: _decomposition(p, ts) for f, ts in state["decompositions"].items()}
        p._finalize_structure(fired=set(saved), same_input=same_input)
        facs = p.factors()
        device = next(iter(p.layers.values())).helper.weight.device
        for name, saved_factor in state["factors"].items():
            if name in facs:
                facs[name].restore(saved_factor, device)
        p._decompositions_stale = any(f.has_value and n not in state["decompositions"]
                                      for n, f in facs.items())
    p.steps = int(state["steps"])
    p.skipped_windows = int(state["skipped_windows"])


def _decomposition(p: KFACPreconditioner, tensors: list[torch.Tensor]) -> Decomposition:
    from kaisa_ds.step import _from_tensors

    device = next(iter(p.layers.values())).helper.weight.device
    moved = [t.to(device=device, dtype=p.config.inv_dtype) for t in tensors]  # type: ignore[arg-type]
    return _from_tensors(p, "", moved)
