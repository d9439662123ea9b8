"""Eigendecompositions ``F = Q diag(λ) Qᵀ``, applied as ``Q_G [(Q_Gᵀ ∇ Q_A) / D] Q_Aᵀ``.

What ``D`` is belongs to the method's :class:`~kaisa_ds.decomposition.scaling.EigenScaling`: K-FAC's
``λ_G λ_Aᵀ + γ`` (the default, :class:`~kaisa_ds.decomposition.scaling.KroneckerScaling`), whose damping ``γ`` is added
at preconditioning, per layer (:func:`kaisa_ds.damping.eigen_shift`), so the cached denominators follow a scheduled
damping without a new decomposition; or the rotated gradient's measured root second moment
(:class:`~kaisa_ds.decomposition.scaling.AdaptiveScaling`). Eigenvalues that rounding leaves below zero are clamped
at 0, which keeps the preconditioner positive definite. A diagonal factor (an embedding's A, a factor above
``max_factor_dim``) is its own eigenvalues with identity eigenvectors.
"""

from __future__ import annotations

from typing import Any

import torch

from kaisa_ds.damping import Damping
from kaisa_ds.decomposition.method import DecompositionMethod, Rates, Stacks, scaled
from kaisa_ds.decomposition.scaling import EigenScaling, KroneckerScaling
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import ComputeMethod


def exact_eigh(factor: torch.Tensor, dtype: torch.dtype) -> Decomposition:
    """``torch.linalg.eigh`` of a (batch of) dense factor(s), eigenvalues clamped at 0."""
    vals, vecs = torch.linalg.eigh(factor.to(dtype))
    return Decomposition(eigvecs=vecs, eigvals=vals.clamp(min=0.0))


class EigenMethod(DecompositionMethod):
    kind = ComputeMethod.EIGEN
    rate_flag = "--eigh-seconds"
    matmuls_per_step = 4
    damped_at_decomposition = False
    matrix = "eigvecs"
    vector = "eigvals"

    def __init__(self, *, scaling: EigenScaling | None = None) -> None:
        self.scaling = scaling if scaling is not None else KroneckerScaling()

    def compute(self, factors: torch.Tensor, *, diagonal: bool, damping: Damping, dtype: torch.dtype,
                previous: Decomposition | None = None) -> Decomposition:
        if diagonal:
            return Decomposition(eigvecs=None, eigvals=factors.to(dtype).clamp(min=0.0))
        return exact_eigh(factors, dtype)

    def layout(self, dim: int, *, diagonal: bool) -> list[tuple[int, ...]]:
        return [(dim,)] if diagonal else [(dim, dim), (dim,)]

    def from_tensors(self, tensors: list[torch.Tensor]) -> Decomposition:
        if len(tensors) == 1:
            return Decomposition(eigvecs=None, eigvals=tensors[0])
        return Decomposition(eigvecs=tensors[0], eigvals=tensors[1])

    def seconds(self, n: int, *, rates: Rates) -> float:
        return scaled(rates.eigh_seconds, n, flag=self.rate_flag)

    def denominator_numel(self, out: int, inp: int, *, a_diagonal: bool) -> int:
        return out * inp  # 1 / (λ_G λ_Aᵀ + γ), or the adaptive scaling's v, per layer

    def prepare(self, stacks: Stacks, damping: Damping) -> None:
        self.scaling.prepare(stacks, damping)

    def apply(self, stacks: Stacks, v: torch.Tensor) -> torch.Tensor:
        v = stacks.g_side(v, transpose=True)
        if stacks.a_mat is not None:
            v = stacks.a_side(v, transpose=False)
        v = self.scaling.scale(stacks, v)
        if stacks.a_mat is not None:
            v = stacks.a_side(v, transpose=True)
        return stacks.g_side(v, transpose=False)

    def export_state(self) -> dict[str, dict[str, Any]]:
        return self.scaling.export()

    def load_state(self, saved: dict[str, dict[str, Any]]) -> None:
        self.scaling.load(saved)

    def state_nbytes(self) -> int:
        return self.scaling.nbytes()
