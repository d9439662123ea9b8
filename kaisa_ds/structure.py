"""The preconditioner's structure after its first window: kept layers, shared factors, work assignment.

:func:`build_structure` is pure: it copies what it changes and raises before anything is handed back, so a
failing first step leaves the preconditioner exactly as it was (every layer and hook still in place).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from kaisa_ds.distributed.assignment import Assignment, WorkUnit, assign_work
from kaisa_ds.distributed.kaisa import KAISACommunicator
from kaisa_ds.factors.factor import KroneckerFactor
from kaisa_ds.layers.discovery import KFACLayer, share_inputs
from kaisa_ds.layers.groups import layer_group


def factors_of(layers: dict[str, KFACLayer]) -> dict[str, KroneckerFactor]:
    """Every distinct factor of ``layers``, in a fixed order (shared A factors once)."""
    out: dict[str, KroneckerFactor] = {}
    for layer in layers.values():
        out.setdefault(layer.a.name, layer.a)
        out.setdefault(layer.g.name, layer.g)
    return out


def layers_device(layers: dict[str, KFACLayer]) -> torch.device:
    """Where the layers' weights live (every preconditioned layer is on one device); the factors follow it."""
    return next(iter(layers.values())).helper.weight.device


def layer_info(layers: dict[str, KFACLayer]) -> dict[str, dict[str, Any]]:
    """What identifies a layer in a saved state: module type, factor sizes (and which are diagonal) and its A
    factor's name."""
    return {n: {"type": type(ly.module).__name__, "a_dim": ly.a.dim, "g_dim": ly.g.dim, "a": ly.a.name,
                "a_diagonal": ly.a.diagonal, "g_diagonal": ly.g.diagonal} for n, ly in layers.items()}


@dataclass
class LayerStructure:
    """Who holds, decomposes and preconditions what; identical on every rank."""

    layers: dict[str, KFACLayer]
    assignment: Assignment
    comm: KAISACommunicator
    unit_factors: dict[str, list[str]] = field(default_factory=dict)  # work unit -> its factors
    unit_layers: dict[str, list[str]] = field(default_factory=dict)  # work unit -> its layers
    factor_unit: dict[str, str] = field(default_factory=dict)
    factor_map: dict[str, KroneckerFactor] = field(default_factory=dict)  # the layers' factors, fixed once built
    factor_labels: dict[str, str] = field(default_factory=dict)  # factor -> its first layer's group + .A/.G

    @property
    def device(self) -> torch.device:
        """Where the layers, their factors and decompositions live."""
        return layers_device(self.layers)

    def factors(self) -> dict[str, KroneckerFactor]:
        """Every distinct factor (the layers never change after the build, so this is computed once)."""
        return self.factor_map

    def holds(self, factor: str, rank: int) -> bool:
        """Whether ``rank`` is a gradient worker of the unit that owns ``factor`` (it keeps its decomposition)."""
        return self.assignment.is_grad_worker(self.factor_unit[factor], rank)

    def decomposes(self, factor: str, rank: int) -> bool:
        return self.assignment.inverse_worker[factor] == rank

    def preconditions(self, layer: str, rank: int) -> bool:
        return self.assignment.is_grad_worker(self.layers[layer].unit, rank)


def work_units(layers: dict[str, KFACLayer]) -> tuple[dict[str, list[str]], list[WorkUnit]]:
    """Each work unit's factors (layers sharing an A factor form one unit), and the units as the assignment
    sees them. Pure, so the planner (:mod:`kaisa_ds.plan`) runs exactly what a real run assigns."""
    units: dict[str, list[str]] = {}
    for layer in layers.values():
        names = units.setdefault(layer.unit, [])
        for f in (layer.a, layer.g):
            if f.name not in names:
                names.append(f.name)
    facs = factors_of(layers)
    work = [WorkUnit(u, tuple((f, facs[f].dim, facs[f].diagonal) for f in fs)) for u, fs in units.items()]
    return units, work


class NoLayerFired(RuntimeError):
    """No layer's forward hook ran before the first step."""


def build_structure(layers: dict[str, KFACLayer], *, fired: set[str], same_input: dict[str, str], world: int,
                    rank: int, grad_workers: int, with_grad: set[str] | None = None) -> LayerStructure:
    """Keep the layers that ``fired``, share A factors between layers reading the same input, assign work.

    ``with_grad``: layers whose weights have gradients, which tells "never called as a module" (gradients but no
    hook) from "no forward pass yet". Raises :class:`NoLayerFired` when nothing fired; the inputs are unchanged.
    """
    kept = {n: dataclasses.replace(ly) for n, ly in layers.items() if n in fired}
    if not kept:
        never = sorted(with_grad or ())
        if never:
            raise NoLayerFired(
                f"K-FAC: no layer's forward hook ran: the layers {never[:8]} have gradients but were not called as a "
                "module during the forward pass (their weights are used directly, as nn.MultiheadAttention does "
                "with out_proj, which K-FAC cannot capture); skip them with skip_layers")
        raise NoLayerFired("K-FAC: step() was called before any forward pass in train mode with gradients "
                           "enabled; run forward and backward first (the preconditioner is unchanged)")
    share_inputs(kept, same_input)
    units, work = work_units(kept)
    facs = factors_of(kept)
    labels: dict[str, str] = {}  # a shared A factor is labelled by its owner, the first layer reading it
    for name, layer in kept.items():
        labels.setdefault(layer.a.name, layer_group(name) + ".A")
        labels.setdefault(layer.g.name, layer_group(name) + ".G")
    assignment = assign_work(work, world=world, grad_workers=grad_workers)
    return LayerStructure(
        layers=kept, assignment=assignment, comm=KAISACommunicator(assignment, rank=rank), unit_factors=units,
        unit_layers={u: [n for n, ly in kept.items() if ly.unit == u] for u in units},
        factor_unit={f: u for u, fs in units.items() for f in fs}, factor_map=facs, factor_labels=labels)
