"""Is K-FAC doing anything? Per layer, at each decomposition: how much of the curvature damping outweighs, and the
cosine between the preconditioned and the raw gradient; a warning (once) when K-FAC has become a rescaled gradient.

Damping share: the share of the spectrum of ``A ⊗ G`` that damping dominates, weighted by where the gradient
lies: with ``ĝ`` the gradient in the eigenbasis of ``A ⊗ G``, ``Σ ĝ² · γ / (λ + γ) / Σ ĝ²``, which is
``γ ⟨∇, P∇⟩ / ‖∇‖²`` for the preconditioned gradient ``P∇`` (so it costs two dot products). 1: damping outweighs
the curvature wherever the gradient is, and K-FAC is ``∇ / γ``, a rescaled gradient; near 0: the curvature
decides. Inverse method, damped per factor: ``(λ_A + γ_A)(λ_G + γ_G)`` in place of ``λ + γ`` and ``γ_A γ_G`` for
``γ``. (Unweighted, the share is near 1 even at a well-tuned damping: most eigenvalues of BERT's factors are far
below their mean, and the few large ones carry the gradient.) A layer counts as a rescaled gradient when its
damping share is over :data:`DOMINATED_SHARE` AND its cosine to the raw gradient is at least
:data:`RESCALED_COSINE`. Computed only on decomposition steps, from tensors the step already has, with one small
all-reduce and one host sync there (decomposition steps sync anyway); nothing on the other steps.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from kaisa_ds.diagnostics import layer_group
from kaisa_ds.precondition.damping import Damping

if TYPE_CHECKING:
    from kaisa_ds.step import StepOwner
    from kaisa_ds.structure import LayerStructure

logger = logging.getLogger(__name__)
DOMINATED_SHARE = 0.5  # damping share over this: damping outweighs most of the layer's curvature
RESCALED_COSINE = 0.99  # preconditioned gradient this close to the raw one: preconditioning changed nothing
Figures = dict[str, tuple[float, float] | None]  # layer -> (damping share, cosine); None: not preconditioned


def _layer_gamma(p: StepOwner, s: LayerStructure, name: str, damping: Damping,
                 shifts: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The layer's ``γ`` (eigen) or ``γ_A γ_G`` (inverse); None when it cannot be known here."""
    if p.grouped.eigen:
        return shifts.get(name)
    layer = s.layers[name]
    if layer.a.value is None or layer.g.value is None:
        return None
    gamma_a = damping.factor_shift(layer.a.value.float(), diagonal=layer.a.diagonal)
    gamma_g = damping.factor_shift(layer.g.value.float(), diagonal=False)
    return torch.as_tensor(gamma_a * gamma_g, dtype=torch.float32).reshape(())  # type: ignore[operator]


def local_figures(p: StepOwner, s: LayerStructure, grads: dict[str, torch.Tensor],
                  pre: dict[str, torch.Tensor], damping: Damping) -> torch.Tensor:
    """``(layers, 3)``: damping share, cosine and 1 for the layers this rank preconditioned, zeros elsewhere."""
    shifts = p.grouped.shifts() if p.grouped.eigen else {}
    device = next(iter(s.layers.values())).helper.weight.device
    rows = []
    for name, layer in s.layers.items():
        held = layer.a.name in p.decompositions and layer.g.name in p.decompositions
        gamma = (_layer_gamma(p, s, name, damping, shifts)
                 if held and name in grads and name in pre and s.preconditions(name, p.rank) else None)
        if gamma is None:
            rows.append(torch.zeros(3, device=device))
            continue
        g, pg = grads[name].flatten().float(), pre[name].flatten().float()
        dot, gg = torch.dot(g, pg), torch.dot(g, g).clamp_min(1e-30)
        share = (gamma.to(device) * dot / gg).clamp(0.0, 1.0)
        cos = dot / (gg.sqrt() * pg.norm()).clamp_min(1e-30)
        rows.append(torch.stack([share, cos, torch.ones((), device=device)]))
    return torch.stack(rows)


def gather(p: StepOwner, s: LayerStructure, table: torch.Tensor) -> Figures:
    """Every layer's figures on every rank (one all-reduce of a few floats per layer, one host sync)."""
    if p.world > 1:
        torch.distributed.all_reduce(table, op=torch.distributed.ReduceOp.SUM)
    out: Figures = {}
    for name, (share, cos, count) in zip(s.layers, table.tolist()):
        out[name] = (share / count, cos / count) if count > 0 else None
    return out


def check(p: StepOwner, s: LayerStructure, grads: dict[str, torch.Tensor], pre: dict[str, torch.Tensor]) -> None:
    """Measure, record in ``p.diagnostics`` and warn (rank 0, once per kind of problem)."""
    damping = p.config.damping_at(p.steps)
    figures = gather(p, s, local_figures(p, s, grads, pre, damping))
    empty = [n for n, ly in s.layers.items() if not (ly.a.has_value and ly.g.has_value)]
    p.diagnostics.record_effectiveness(figures, empty=empty)
    if p.rank == 0:
        warn(figures, empty=empty, damping=damping, warned=p.diagnostics.warned)


def warn(figures: Figures, *, empty: list[str], damping: Damping, warned: set[str]) -> None:
    measured = {n: f for n, f in figures.items() if f is not None}
    rescaled = sorted(n for n, (share, cos) in measured.items() if share > DOMINATED_SHARE and cos >= RESCALED_COSINE)
    if measured and len(rescaled) > len(measured) / 2 and "rescaled" not in warned:
        warned.add("rescaled")
        fix = ("lower relative_damping" if damping.relative else
               "remove damping to use the scale-aware default (relative_damping), or lower damping")
        logger.warning("K-FAC has become a rescaled gradient: with %s, damping outweighs most of the curvature in %d "
                       "of %d layers and their preconditioned gradients are within cosine %.2f of the raw ones "
                       "(layer groups: %s); %s (kfac.%s in a DeepSpeed config)", damping.describe(), len(rescaled),
                       len(measured), RESCALED_COSINE, _groups(rescaled),
                       fix, "relative_damping" if damping.relative else "damping")
    away = sorted(n for n, (_, cos) in measured.items() if cos < 0)
    if away and "away" not in warned:
        warned.add("away")
        logger.warning("K-FAC: the preconditioned gradient points away from the raw gradient in %d layers (%s): "
                       "the decompositions are stale or broken; raise the damping (%s) or decompose more often "
                       "(inv_update_steps)", len(away), ", ".join(away[:8]), damping.describe())
    missing = sorted(set(empty) | {n for n, f in figures.items() if f is None})
    if missing and "empty" not in warned:
        warned.add("empty")
        logger.warning("K-FAC: %d layers were not preconditioned at this decomposition (empty factors: the layer "
                       "was unused or no sampled token reached it, or it has no gradient or decomposition): %s",
                       len(missing), ", ".join(missing[:12]) + (" ..." if len(missing) > 12 else ""))


def _groups(layers: list[str]) -> str:
    groups = sorted({layer_group(n) for n in layers})
    return ", ".join(groups[:8]) + (" ..." if len(groups) > 8 else "")
