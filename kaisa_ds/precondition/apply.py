"""``(A ⊗ G + damping·I)⁻¹ vec(∇)`` through eigendecompositions, or through damped inverses.

Eigen method: ``Q_G [(Q_Gᵀ ∇ Q_A) / (λ_G λ_Aᵀ + damping)] Q_Aᵀ``.
Inverse method: ``(G + damping·I)⁻¹ ∇ (A + damping·I)⁻¹``.
Diagonal factors (embedding inputs) have no eigenvectors: their rotation is the identity.
"""

from __future__ import annotations

import torch

from kaisa_ds.decomposition.decompose import Decomposition


def precondition_eigen(grad: torch.Tensor, a: Decomposition, g: Decomposition, damping: float) -> torch.Tensor:
    """Eigen-basis preconditioning of a (out, in) gradient matrix, in the decompositions' dtype."""
    assert a.eigvals is not None and g.eigvals is not None
    dtype = g.eigvals.dtype
    v = grad.to(dtype)
    if g.eigvecs is not None:
        v = g.eigvecs.t() @ v
    if a.eigvecs is not None:
        v = v @ a.eigvecs
    v = v / (torch.outer(g.eigvals, a.eigvals) + damping)
    if a.eigvecs is not None:
        v = v @ a.eigvecs.t()
    if g.eigvecs is not None:
        v = g.eigvecs @ v
    return v.to(torch.float32)


def precondition_inverse(grad: torch.Tensor, a: Decomposition, g: Decomposition) -> torch.Tensor:
    """Damped-inverse preconditioning of a (out, in) gradient matrix."""
    assert a.inverse is not None and g.inverse is not None
    dtype = g.inverse.dtype
    v = grad.to(dtype)
    v = g.inverse * v if g.inverse.dim() == 1 else g.inverse @ v
    v = v * a.inverse if a.inverse.dim() == 1 else v @ a.inverse
    return v.to(torch.float32)


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
