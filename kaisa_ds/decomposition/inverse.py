"""Damped inverses ``(F + γ_F I)⁻¹`` of each factor, applied as ``(G + γ_G I)⁻¹ ∇ (A + γ_A I)⁻¹``.

The damping is split between the two factors at decomposition (:func:`kaisa_ds.damping.factor_shift`), so a new
damping value needs a new decomposition. Inverted through Cholesky, or through a clamped eigendecomposition when
rounding leaves a factor indefinite (:func:`spd_inverse`); a diagonal factor is a vector.
"""

from __future__ import annotations

import logging

import torch

from kaisa_ds.damping import Damping, factor_shift
from kaisa_ds.decomposition.method import DecompositionMethod, Rates, Stacks, scaled
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import ComputeMethod

logger = logging.getLogger(__name__)


class InverseMethod(DecompositionMethod):
    kind = ComputeMethod.INVERSE
    rate_flag = "--inverse-seconds"
    matmuls_per_step = 2
    damped_at_decomposition = True
    matrix = "inverse"
    vector = "inverse"

    def compute(self, factors: torch.Tensor, *, diagonal: bool, damping: Damping, dtype: torch.dtype,
                previous: Decomposition | None = None) -> Decomposition:
        f = factors.to(dtype)
        shift = factor_shift(damping, f, diagonal=diagonal)
        if diagonal:
            return Decomposition(inverse=1.0 / (f.clamp(min=0.0) + shift))
        eye = torch.eye(f.shape[-1], dtype=dtype, device=f.device)
        return Decomposition(inverse=spd_inverse(f + shift * eye, shift=shift))

    def layout(self, dim: int, *, diagonal: bool) -> list[tuple[int, ...]]:
        return [(dim,)] if diagonal else [(dim, dim)]

    def from_tensors(self, tensors: list[torch.Tensor]) -> Decomposition:
        return Decomposition(inverse=tensors[0])

    def seconds(self, n: int, *, rates: Rates) -> float:
        return scaled(rates.inverse_seconds, n, flag=self.rate_flag)

    def denominator_numel(self, out: int, inp: int, *, a_diagonal: bool) -> int:
        return inp if a_diagonal else 0  # a diagonal A's inverse, repeated per layer

    def prepare(self, stacks: Stacks, damping: Damping) -> None:
        if stacks.a_mat is None and stacks.a_vec is not None:  # a diagonal A: its damped inverse is a vector
            stacks.scale = stacks.a_vec.repeat_interleave(stacks.share, 0).unsqueeze(1)
        if stacks.g_mat is None and stacks.g_vec is not None:
            stacks.g_rows = stacks.g_vec.unsqueeze(2)

    def apply(self, stacks: Stacks, v: torch.Tensor) -> torch.Tensor:
        v = stacks.g_side(v, transpose=False)
        if stacks.a_mat is not None:
            return stacks.a_side(v, transpose=False)
        assert stacks.scale is not None
        return v * stacks.scale


def spd_inverse(m: torch.Tensor, *, shift: torch.Tensor | float) -> torch.Tensor:
    """Inverse of a (batch of) factor(s) ``F`` damped by ``shift`` (``m = F + shift·I``), always positive definite.

    Through Cholesky: half an LU inverse's work on an H100 (0.97 s vs 2.1 s a BERT-Large round) and exactly
    symmetric. A factor is positive semi-definite in exact arithmetic, but rounding (FP16 storage, a running average
    of Gram matrices) leaves eigenvalues a little below zero, and when one is below ``-shift``, ``m`` is indefinite
    and Cholesky fails. Those matrices only are inverted through their eigendecomposition with the factor's
    eigenvalues clamped at 0, as the eigen method clamps them: ``Q diag(1 / (max(λ_F, 0) + shift)) Qᵀ``. (An LU
    inverse of the indefinite ``m``, as before 2026-11-27, made the preconditioner indefinite: on an H100 at
    BERT-Large it turned the gradient away from itself in up to 17 of 144 layers.) One host sync per call, on
    decomposition steps only."""
    chol, info = torch.linalg.cholesky_ex(m)
    failed = info != 0
    if not bool(failed.any()):
        return torch.cholesky_inverse(chol)
    if m.dim() == 2:
        _note_indefinite(1, 1, m.shape[-1])
        return _clamped_inverse(m, shift)
    out = torch.cholesky_inverse(chol)
    bad = failed.nonzero().flatten()
    floor = shift[bad] if isinstance(shift, torch.Tensor) and shift.dim() > 0 else shift
    out[bad] = _clamped_inverse(m[bad], floor)
    _note_indefinite(int(bad.numel()), int(m.shape[0]), m.shape[-1])
    return out


_WARNED_SIZES: set[int] = set()  # factor sizes already warned about (once per size and process)


def _note_indefinite(count: int, total: int, dim: int) -> None:
    if dim in _WARNED_SIZES:
        return
    _WARNED_SIZES.add(dim)
    logger.warning("K-FAC: %d of %d damped %dx%d factors were not positive definite (their rounding reaches below "
                   "the damping); they are inverted through a clamped eigendecomposition, slower than Cholesky. "
                   "Raise the damping, store factors in fp32 (kfac.factor_dtype) or use compute_method 'eigen' "
                   "(logged once per size)", count, total, dim, dim)


def _clamped_inverse(m: torch.Tensor, shift: torch.Tensor | float) -> torch.Tensor:
    """``Q diag(1 / max(λ, shift)) Qᵀ`` for ``m = F + shift·I`` (so ``λ - shift`` are the factor's eigenvalues)."""
    vals, vecs = torch.linalg.eigh(m)
    floor = shift.reshape(*vals.shape[:-1], 1) if isinstance(shift, torch.Tensor) else shift
    vals = torch.maximum(vals, torch.as_tensor(floor, dtype=vals.dtype, device=vals.device))
    return (vecs / vals.unsqueeze(-2)) @ vecs.transpose(-2, -1)
