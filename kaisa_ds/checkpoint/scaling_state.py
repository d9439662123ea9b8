"""The adaptive eigenvalues' second moments in checkpoints (:class:`~kaisa_ds.decomposition.scaling.AdaptiveScaling`).

Each layer's ``v`` (shaped like its gradient matrix, ``(G dim, A dim)``) and its count live on the ranks that
precondition the layer, identical on each. The rank that decomposes the layer's G factor (one of them) writes it:
:func:`gather_scaling` broadcasts it from there for the full ``state_dict``, :func:`owned_scaling` is that rank's
share of a sharded save. :func:`usable_scaling` checks a saved entry against the layer (shape, finite, count) and
keeps those this rank preconditions at the *current* world size; a layer without a usable entry starts its averages
from zero, with a warning. Under K-FAC's own eigenvalues there is no such state, and nothing here communicates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.method import DecompositionMethod
from kaisa_ds.distributed.collectives import broadcast_flat
from kaisa_ds.enums import Eigenvalues
from kaisa_ds.structure import LayerStructure

logger = logging.getLogger(__name__)
KEY = "scaling_state"  # the state's key (optional: states saved without it start the averages from zero)


class Grouped(Protocol):
    @property
    def method(self) -> DecompositionMethod: ...


class ScalingOwner(Protocol):
    @property
    def config(self) -> KFACConfig: ...

    @property
    def world(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def structure(self) -> LayerStructure | None: ...

    @property
    def grouped(self) -> Grouped: ...


def _writes(s: LayerStructure, layer: str, rank: int) -> bool:
    return s.decomposes(s.layers[layer].g.name, rank)


def _shape(s: LayerStructure, layer: str) -> tuple[int, int]:
    return s.layers[layer].g.dim, s.layers[layer].a.dim


def owned_scaling(p: ScalingOwner) -> dict[str, dict[str, Any]]:
    """This rank's share, on CPU, with no communication: the layers whose G factor it decomposes."""
    s = p.structure
    if s is None or p.config.scaling is not Eigenvalues.ADAPTIVE:
        return {}
    return {n: e for n, e in p.grouped.method.export_state().items() if n in s.layers and _writes(s, n, p.rank)}


def gather_scaling(p: ScalingOwner) -> dict[str, dict[str, Any]]:
    """Every layer's entry, on every rank (one broadcast per writing rank)."""
    s = p.structure
    if s is None or p.config.scaling is not Eigenvalues.ADAPTIVE:
        return {}
    mine = p.grouped.method.export_state()
    out: dict[str, dict[str, Any]] = {}
    for src in range(p.world):
        names = [n for n in s.layers if _writes(s, n, src)]
        parts: list[torch.Tensor] = []
        for n in names:
            entry = mine.get(n) if src == p.rank else None
            second = entry["second"].float() if entry is not None else torch.zeros(_shape(s, n))
            parts += [second.to(s.device).contiguous(),
                      torch.tensor([entry["count"] if entry else 0, float(entry is not None)], device=s.device)]
        if p.world > 1:
            parts = broadcast_flat(parts, src=src, group=None)
        for i, n in enumerate(names):
            second, (count, present) = parts[2 * i], parts[2 * i + 1].tolist()
            if present > 0:
                out[n] = {"second": second.detach().cpu().clone(), "count": int(count)}
    return out


def usable_scaling(s: LayerStructure | None, saved: Mapping[str, Any] | None, *, config: KFACConfig, rank: int,
                   source: str) -> dict[str, dict[str, Any]]:
    """The saved entries ``rank`` can use under structure ``s`` (those of layers it preconditions, of the right shape,
    finite, with a count ≥ 0), copied onto the layers' device; a warning names what is missing or dropped."""
    if s is None or config.scaling is not Eigenvalues.ADAPTIVE:
        return {}
    saved = saved or {}
    kept: dict[str, dict[str, Any]] = {}
    for name in s.layers:
        if not s.preconditions(name, rank) or name not in saved:
            continue
        entry = saved[name]
        second, count = entry.get("second"), entry.get("count")
        if (isinstance(second, torch.Tensor) and tuple(second.shape) == _shape(s, name) and isinstance(count, int)
                and count >= 0 and bool(torch.isfinite(second).all()) and bool((second >= 0).all())):
            kept[name] = {"second": second.to(s.device, torch.float32, copy=True), "count": count}
        else:
            logger.warning("K-FAC state %s: the adaptive eigenvalues' second moments of %s are unusable (shape, "
                           "count or values); they start again from zero", source, name)
    lacking = sorted(n for n in s.layers if s.preconditions(n, rank) and n not in saved)
    if lacking:
        logger.warning("K-FAC state %s has no adaptive second moments for %d layers (saved under "
                       "eigenvalues='kronecker', or before they were kept): they start from zero (%s)", source,
                       len(lacking), ", ".join(lacking[:6]) + (" ..." if len(lacking) > 6 else ""))
    return kept
