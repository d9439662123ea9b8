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


def graft_to_gradient_norms(preconditioned: list[torch.Tensor], grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each preconditioned gradient rescaled to the norm of its raw gradient (one left as is where its own norm is
    0): K-FAC's direction at the gradient's size. Batched norms, no host sync."""
    if not preconditioned:
        return []
    pre_norms = torch.stack([n.float() for n in torch._foreach_norm(preconditioned)])
    grad_norms = torch.stack([n.float().to(pre_norms.device) for n in torch._foreach_norm(grads)])
    ratio = torch.where(pre_norms > 0, grad_norms / pre_norms, torch.ones_like(pre_norms))
    return [p * r.to(p.dtype) for p, r in zip(preconditioned, ratio.unbind())]
