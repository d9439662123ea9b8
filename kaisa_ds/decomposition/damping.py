"""The shift damping adds to each layer's curvature, absolute or relative to the curvature.

Relative damping ``r`` makes the damping scale with the curvature it damps, so that multiplying the loss by any
``c`` (which multiplies G by ``c²`` and leaves A alone) multiplies every preconditioned gradient by ``1/c²`` and
leaves its direction unchanged:

* eigen method, ``1 / (λ_G λ_Aᵀ + γ)``: ``γ = r · mean(λ_A) · mean(λ_G)``, ``r`` times the mean eigenvalue of
  ``A ⊗ G`` (``mean(λ) = trace / dim``);
* inverse method, ``(G + γ_G I)⁻¹ ∇ (A + γ_A I)⁻¹``: the same ``γ`` split between the factors as Martens & Grosse
  (2015, §6.3) split it with π: ``γ_A = √r · mean(λ_A)``, ``γ_G = √r · mean(λ_G)`` (so ``γ_A γ_G = γ``).

Diagonal factors (embedding inputs) use the mean of their diagonal. Absolute damping adds the value as given
(eigen: ``γ``; inverse: ``γ`` to each factor), which is the library's behaviour before relative damping. The damping
in force (its mode and value) is :class:`kaisa_ds.config.Damping`; this module is the math both methods share (the
inverse method applies it at decomposition, the eigen method at preconditioning).
"""

from __future__ import annotations

import math

import torch

from kaisa_ds.config import Damping

FLOOR = 1e-30  # the smallest shift: an all-zero factor still gets a finite preconditioner


def eigen_shift(damping: Damping, lam_g: torch.Tensor, lam_a: torch.Tensor) -> torch.Tensor:
    """``γ`` per layer, shaped ``(L, 1, 1)``, for eigenvalues ``lam_g`` ``(L, out)`` and ``lam_a`` ``(L, in)``."""
    if not damping.relative:
        return torch.full((lam_g.shape[0], 1, 1), damping.value, dtype=lam_g.dtype, device=lam_g.device)
    gamma = damping.value * lam_g.mean(-1) * lam_a.mean(-1)
    return gamma.clamp_min(FLOOR).view(-1, 1, 1)


def factor_shift(damping: Damping, factor: torch.Tensor, *, diagonal: bool) -> torch.Tensor | float:
    """What the inverse method adds to the diagonal of ``factor`` (``(n,)``, ``(n, n)`` or a batch of them);
    a tensor that broadcasts against it, or the absolute value."""
    if not damping.relative:
        return damping.value
    mean = factor.mean(-1) if diagonal else factor.diagonal(dim1=-2, dim2=-1).mean(-1)
    shift = (math.sqrt(damping.value) * mean).clamp_min(FLOOR)
    return shift.unsqueeze(-1) if diagonal else shift.unsqueeze(-1).unsqueeze(-1)
