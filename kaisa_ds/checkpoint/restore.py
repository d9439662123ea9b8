"""Restoring a saved K-FAC state: everything is rebuilt aside and handed back, for the preconditioner to swap in.

:func:`restore_state` validates a whole state first (:func:`~kaisa_ds.checkpoint.state.validate_state`), then builds
fresh layers and their structure, fills their factors and loads the decompositions this rank holds: a
:class:`Restored` that :meth:`KFACPreconditioner.load_state_dict` applies. The sharded load reads decompositions
separately, after the rest: :func:`usable_decompositions` keeps those that fit and says whether any factor must be
decomposed again at the next step. Nothing here assigns the preconditioner's fields.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from kaisa_ds.checkpoint.scaling_state import KEY as SCALING_KEY
from kaisa_ds.checkpoint.scaling_state import usable_scaling
from kaisa_ds.checkpoint.state import StateOwner, saved_method, validate_state
from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.decompose import from_tensors, layout
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import ComputeMethod
from kaisa_ds.layers.discovery import KFACLayer, discover_layers
from kaisa_ds.structure import LayerStructure, build_structure

logger = logging.getLogger(__name__)


class RestoreTarget(Protocol):
    """What a restore reads of the preconditioner it rebuilds a state for."""

    @property
    def config(self) -> KFACConfig: ...

    @property
    def model(self) -> nn.Module: ...

    @property
    def world(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def grad_workers(self) -> int: ...

    @property
    def candidates(self) -> Mapping[str, KFACLayer]: ...

    @property
    def discovered_info(self) -> dict[str, dict[str, Any]]: ...


@dataclass
class Restored:
    """A saved state rebuilt aside; nothing of the preconditioner has changed yet."""

    steps: int
    skipped_windows: int
    statistic_rows: int | None  # rows per factor update ("auto" interval); None: measured again
    cost_interval: int | None  # the cost rule's interval ("auto"); None: timed again
    candidates: dict[str, KFACLayer] | None  # fresh layers holding the saved factors; None: saved before any step
    structure: LayerStructure | None  # the saved layers' structure at this world size
    decompositions: dict[str, Decomposition]  # of the factors this rank holds
    needs_decomposition: bool  # a factor with a value has no decomposition: decompose at the next step
    scaling_state: dict[str, dict[str, Any]] = field(default_factory=dict)  # the method's, of this rank's layers


def restore_state(p: RestoreTarget, state: dict[str, Any]) -> Restored:
    """``state`` (:meth:`KFACPreconditioner.state_dict`'s format) rebuilt for ``p``'s model at this world size.
    ValueError naming the problem when it belongs to another model or is corrupt."""
    diagonal = {f.name: f.diagonal for ly in p.candidates.values() for f in (ly.a, ly.g)}
    method = p.config.method
    dropped = validate_state(state, discovered=p.discovered_info, diagonal=diagonal, method=method)
    counters: dict[str, Any] = {"steps": int(state["steps"]), "skipped_windows": int(state["skipped_windows"]),
                                "statistic_rows": state.get("statistic_rows"),
                                "cost_interval": state.get("cost_interval")}
    if state["layers"] is None:
        return Restored(**counters, candidates=None, structure=None, decompositions={}, needs_decomposition=False)
    saved = state["layers"]
    same_input = {n: next(m for m in saved if saved[m]["a"] == info["a"])
                  for n, info in saved.items() if not info["a"].startswith(f"{n}.")}
    fresh = discover_layers(p.model, p.config)  # new factor objects: the current ones stay intact until the swap
    structure = build_structure(fresh, fired=set(saved), same_input=same_input, world=p.world, rank=p.rank,
                                grad_workers=p.grad_workers)
    facs = structure.factors()
    device = structure.device
    for name, saved_factor in state["factors"].items():
        if name in facs:
            facs[name].restore(saved_factor, device)
    present = set(state["decompositions"]) - set(dropped) if saved_method(state) is method else set()
    decompositions = {f: from_tensors([t.to(device=device, dtype=p.config.inv_dtype_on(device))
                                       for t in ts], method=method)
                      for f, ts in state["decompositions"].items() if f in present and structure.holds(f, p.rank)}
    return Restored(**counters, candidates=fresh, structure=structure, decompositions=decompositions,
                    needs_decomposition=any(  # decided from the state alone: the same on every rank
                        f.has_value and n not in present for n, f in facs.items()),
                    scaling_state=usable_scaling(structure, state.get(SCALING_KEY), config=p.config, rank=p.rank,
                                                 source="state_dict"))


def usable_decompositions(p: StateOwner, found: dict[str, list[torch.Tensor]], *,
                          source: str) -> tuple[dict[str, Decomposition], bool]:
    """The decompositions read back (after :func:`restore_state` of the rest) that fit the factors this rank holds,
    and whether some factor must be decomposed again at the next step: one that is missing, misshapen or not finite
    is recomputed from its factor, on every rank alike (a collective under torch.distributed). ``source`` names the
    files in warnings."""
    s = p.structure
    if s is None:
        return {}, False
    facs = s.factors()
    method = p.config.method
    device = s.device
    kept: dict[str, Decomposition] = {}
    for name, tensors in found.items():
        if name in facs and s.holds(name, p.rank) and _usable(name, tensors, dim=facs[name].dim,
                                                              diagonal=facs[name].diagonal, method=method,
                                                              source=source):
            kept[name] = from_tensors([t.to(device=device, dtype=p.config.inv_dtype_on(device), copy=True)
                                       for t in tensors], method=method)
    missing = any(f.has_value and s.holds(n, p.rank) and n not in kept for n, f in facs.items())
    if p.world > 1:  # a decomposition step is a collective: every rank must agree to run one
        flag = torch.tensor([float(missing)], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        missing = bool(flag.item() > 0)
    return kept, missing


def _usable(name: str, tensors: list[torch.Tensor], *, dim: int, diagonal: bool, method: ComputeMethod,
            source: str) -> bool:
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
