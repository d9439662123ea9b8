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
from collections.abc import Collection, Mapping

import torch

from kaisa_ds.damping import Damping, factor_shift
from kaisa_ds.layers.discovery import KFACLayer
from kaisa_ds.layers.groups import layer_group

logger = logging.getLogger(__name__)
DOMINATED_SHARE = 0.5  # damping share over this: damping outweighs most of the layer's curvature
RESCALED_COSINE = 0.99  # preconditioned gradient this close to the raw one: preconditioning changed nothing
Figures = dict[str, tuple[float, float] | None]  # layer -> (damping share, cosine); None: not preconditioned


def _layer_gamma(layer: KFACLayer, damping: Damping, shifts: Mapping[str, torch.Tensor] | None) -> torch.Tensor | None:
    """The layer's ``γ`` (eigen: from ``shifts``) or ``γ_A γ_G`` (inverse: ``shifts`` is None); None when it cannot
    be known here."""
    if shifts is not None:
        return shifts.get(layer.name)
    if layer.a.value is None or layer.g.value is None:
        return None
    gamma_a = factor_shift(damping, layer.a.value.float(), diagonal=layer.a.diagonal)
    gamma_g = factor_shift(damping, layer.g.value.float(), diagonal=layer.g.diagonal)
    return torch.as_tensor(gamma_a * gamma_g, dtype=torch.float32).reshape(())  # type: ignore[operator]


def local_figures(layers: Mapping[str, KFACLayer], grads: Mapping[str, torch.Tensor], pre: Mapping[str, torch.Tensor],
                  *, measured: Collection[str], shifts: Mapping[str, torch.Tensor] | None,
                  damping: Damping) -> torch.Tensor:
    """``(layers, 3)``: damping share, cosine and 1 for the ``measured`` layers (those this rank preconditioned with
    both decompositions), zeros elsewhere."""
    device = next(iter(layers.values())).helper.weight.device
    rows = []
    for name, layer in layers.items():
        gamma = (_layer_gamma(layer, damping, shifts) if name in measured and name in grads and name in pre
                 else None)
        if gamma is None:
            rows.append(torch.zeros(3, device=device))
            continue
        g, pg = grads[name].flatten().float(), pre[name].flatten().float()
        dot, gg = torch.dot(g, pg), torch.dot(g, g).clamp_min(1e-30)
        share = (gamma.to(device) * dot / gg).clamp(0.0, 1.0)
        cos = dot / (gg.sqrt() * pg.norm()).clamp_min(1e-30)
        rows.append(torch.stack([share, cos, torch.ones((), device=device)]))
    return torch.stack(rows)


def gather(layers: Mapping[str, KFACLayer], table: torch.Tensor, *, world: int) -> Figures:
    """Every layer's figures on every rank (one all-reduce of a few floats per layer, one host sync)."""
    if world > 1:
        torch.distributed.all_reduce(table, op=torch.distributed.ReduceOp.SUM)
    out: Figures = {}
    for name, (share, cos, count) in zip(layers, table.tolist()):
        out[name] = (share / count, cos / count) if count > 0 else None
    return out


def measure(layers: Mapping[str, KFACLayer], grads: Mapping[str, torch.Tensor], pre: Mapping[str, torch.Tensor], *,
            measured: Collection[str], shifts: Mapping[str, torch.Tensor] | None, damping: Damping,
            world: int) -> Figures:
    """Every layer's (damping share, cosine to the raw gradient) on every rank, from the ``measured`` layers of all
    ranks (a collective under torch.distributed). ``shifts``: the eigen method's ``γ`` per layer; None for the
    inverse method (its shifts are recomputed from the factors)."""
    table = local_figures(layers, grads, pre, measured=measured, shifts=shifts, damping=damping)
    return gather(layers, table, world=world)


def empty_layers(layers: Mapping[str, KFACLayer]) -> list[str]:
    """Layers with a factor that holds no statistics yet (unused, or no sampled token reached them)."""
    return [n for n, ly in layers.items() if not (ly.a.has_value and ly.g.has_value)]


def warn(figures: Figures, *, empty: list[str], damping: Damping, warned: Collection[str]) -> set[str]:
    """Log each kind of problem the figures show (rescaled gradient, pointing away, unpreconditioned layers) unless
    it is in ``warned`` already; the kinds logged now."""
    logged: set[str] = set()
    measured = {n: f for n, f in figures.items() if f is not None}
    rescaled = sorted(n for n, (share, cos) in measured.items() if share > DOMINATED_SHARE and cos >= RESCALED_COSINE)
    if measured and len(rescaled) > len(measured) / 2 and "rescaled" not in warned:
        logged.add("rescaled")
        fix = ("lower relative_damping" if damping.relative else
               "remove damping to use the scale-aware default (relative_damping), or lower damping")
        logger.warning("K-FAC has become a rescaled gradient: with %s, damping outweighs most of the curvature in %d "
                       "of %d layers and their preconditioned gradients are within cosine %.2f of the raw ones "
                       "(layer groups: %s); %s (kfac.%s in a DeepSpeed config)", damping.describe(), len(rescaled),
                       len(measured), RESCALED_COSINE, _groups(rescaled),
                       fix, "relative_damping" if damping.relative else "damping")
    away = sorted(n for n, (_, cos) in measured.items() if cos < 0)
    if away and "away" not in warned:
        logged.add("away")
        logger.warning("K-FAC: the preconditioned gradient points away from the raw gradient in %d layers (%s): "
                       "the decompositions are stale or broken; raise the damping (%s) or decompose more often "
                       "(inv_update_steps)", len(away), ", ".join(away[:8]), damping.describe())
    missing = sorted(set(empty) | {n for n, f in figures.items() if f is None})
    if missing and "empty" not in warned:
        logged.add("empty")
        logger.warning("K-FAC: %d layers were not preconditioned at this decomposition (empty factors: the layer "
                       "was unused or no sampled token reached it, or it has no gradient or decomposition): %s",
                       len(missing), ", ".join(missing[:12]) + (" ..." if len(missing) > 12 else ""))
    return logged


def _groups(layers: list[str]) -> str:
    groups = sorted({layer_group(n) for n in layers})
    return ", ".join(groups[:8]) + (" ..." if len(groups) > 8 else "")
