"""The damping in force and the shift it adds to each layer's curvature, absolute or relative to the curvature.

Relative damping ``r`` makes the damping scale with the curvature it damps, so that multiplying the loss by any
``c`` (which multiplies G by ``c²`` and leaves A alone) multiplies every preconditioned gradient by ``1/c²`` and
leaves its direction unchanged:

* eigen method, ``1 / (λ_G λ_Aᵀ + γ)``: ``γ = r · mean(λ_A) · mean(λ_G)``, ``r`` times the mean eigenvalue of
  ``A ⊗ G`` (``mean(λ) = trace / dim``);
* inverse method, ``(G + γ_G I)⁻¹ ∇ (A + γ_A I)⁻¹``: the same ``γ`` split between the factors as Martens & Grosse
  (2015, §6.3) split it with π: ``γ_A = √r · mean(λ_A)``, ``γ_G = √r · mean(λ_G)`` (so ``γ_A γ_G = γ``).

Diagonal factors (embedding inputs) use the mean of their diagonal. Absolute damping adds the value as given
(eigen: ``γ``; inverse: ``γ`` to each factor), which is the library's behaviour before relative damping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kaisa_ds.enums import DampingMode

FLOOR = 1e-30  # the smallest shift: an all-zero factor still gets a finite preconditioner


@dataclass(frozen=True)
class Damping:
    """A damping value and what it is measured against (:class:`~kaisa_ds.enums.DampingMode`)."""

    mode: DampingMode
    value: float

    @property
    def relative(self) -> bool:
        return self.mode is DampingMode.RELATIVE

    def eigen_shift(self, lam_g: torch.Tensor, lam_a: torch.Tensor) -> torch.Tensor:
        """``γ`` per layer, shaped ``(L, 1, 1)``, for eigenvalues ``lam_g`` ``(L, out)`` and ``lam_a`` ``(L, in)``."""
        if not self.relative:
            return torch.full((lam_g.shape[0], 1, 1), self.value, dtype=lam_g.dtype, device=lam_g.device)
        gamma = self.value * lam_g.mean(-1) * lam_a.mean(-1)
        return gamma.clamp_min(FLOOR).view(-1, 1, 1)

    def factor_shift(self, factor: torch.Tensor, *, diagonal: bool) -> torch.Tensor | float:
        """What the inverse method adds to the diagonal of ``factor`` (``(n,)``, ``(n, n)`` or a batch of them);
        a tensor that broadcasts against it, or the absolute value."""
        if not self.relative:
            return self.value
        mean = factor.mean(-1) if diagonal else factor.diagonal(dim1=-2, dim2=-1).mean(-1)
        shift = (math.sqrt(self.value) * mean).clamp_min(FLOOR)
        return shift.unsqueeze(-1) if diagonal else shift.unsqueeze(-1).unsqueeze(-1)

    def describe(self) -> str:
        if self.relative:
            return f"relative_damping={self.value:g} (× each layer's mean eigenvalue of A ⊗ G)"
        return f"damping={self.value:g} (absolute)"
