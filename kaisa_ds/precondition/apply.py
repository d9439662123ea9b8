"""The size of the preconditioned step: KAISA's KL clip (one scale for every preconditioned gradient, so the whole
step stays in a trust region) and grafting (each layer's preconditioned gradient at its raw gradient's norm).

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


def graft(directions: list[torch.Tensor], sizes: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor of ``directions`` rescaled to the norm of its tensor in ``sizes`` (one whose own norm is 0 is left
    as is). Grafting (Agarwal et al. 2020): K-FAC's direction at the gradient's size, or, as an ablation, the
    gradient's direction at K-FAC's size. Batched norms, no host sync."""
    if not directions:
        return []
    own = torch.stack([n.float() for n in torch._foreach_norm(directions)])
    wanted = torch.stack([n.float().to(own.device) for n in torch._foreach_norm(sizes)])
    ratio = torch.where(own > 0, wanted / own, torch.ones_like(own))
    return [d * r.to(d.dtype) for d, r in zip(directions, ratio.unbind())]
