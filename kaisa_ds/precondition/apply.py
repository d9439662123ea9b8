"""KAISA's KL clip: one scale for every preconditioned gradient, so the whole step stays in a trust region.

The preconditioning itself is :mod:`kaisa_ds.precondition.grouped`.
"""

from __future__ import annotations

import torch


def kl_clip_scale(
    preconditioned: list[torch.Tensor], grads: list[torch.Tensor], *, lr: float, kl_clip: float
) -> torch.Tensor:
    """``ν = min(1, sqrt(kl_clip / (lr² · |Σ ⟨P_i, ∇_i⟩|)))`` as a 0-d tensor (no host sync)."""
    if not preconditioned:
        return torch.ones(())
    dots = torch.stack([torch.vdot(p.reshape(-1), g.reshape(-1)) for p, g in zip(preconditioned, grads)])
    vg = dots.sum().abs() * (lr**2)
    if lr == 0:
        return torch.ones((), device=vg.device)
    return torch.clamp(torch.sqrt(kl_clip / vg), max=1.0)
