"""Eigendecompositions and damped inverses of factors, with an FP64 retry and a keep-previous fallback.

Factors may be stored in FP16/BF16; they are cast to FP32 (or FP64 on request) here and the result
is stored in ``inv_dtype``. A decomposition that raises or returns non-finite values is retried in
FP64; if that also fails the caller keeps its previous decomposition (``None`` is returned), so a
bad factor never crashes training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)


@dataclass
class Decomposition:
    """Eigen method: ``F = Q diag(λ) Qᵀ`` (Q is None for a diagonal factor).
    Inverse method: ``inverse = (F + damping·I)⁻¹`` (a vector for a diagonal factor)."""

    eigvecs: torch.Tensor | None = None
    eigvals: torch.Tensor | None = None
    inverse: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.eigvecs, self.eigvals, self.inverse) if t is not None]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def _eigen(factor: torch.Tensor, dtype: torch.dtype, diagonal: bool) -> Decomposition:
    f = factor.to(dtype)
    if diagonal:
        return Decomposition(eigvecs=None, eigvals=f.clamp(min=0.0))
    vals, vecs = torch.linalg.eigh(f)
    return Decomposition(eigvecs=vecs, eigvals=vals.clamp(min=0.0))


def _inverse(factor: torch.Tensor, dtype: torch.dtype, diagonal: bool, damping: float) -> Decomposition:
    f = factor.to(dtype)
    if diagonal:
        return Decomposition(inverse=1.0 / (f + damping))
    eye = torch.eye(f.shape[0], dtype=dtype, device=f.device)
    return Decomposition(inverse=torch.linalg.inv(f + damping * eye))


def _finite(dec: Decomposition) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in dec.tensors())


def decompose(
    factor: torch.Tensor, *, method: str, diagonal: bool, damping: float, compute_dtype: torch.dtype,
    out_dtype: torch.dtype, name: str = "factor",
) -> Decomposition | None:
    """Decompose one factor; None when both the requested precision and FP64 fail."""
    dtypes = [compute_dtype] if compute_dtype == torch.float64 else [compute_dtype, torch.float64]
    for dtype in dtypes:
        try:
            if method == "eigen":
                dec = _eigen(factor, dtype, diagonal)
            else:
                dec = _inverse(factor, dtype, diagonal, damping)
        except (RuntimeError, torch.linalg.LinAlgError) as exc:  # type: ignore[misc]
            logger.warning("K-FAC: %s decomposition failed in %s (%s)", name, dtype, exc)
            continue
        if _finite(dec):
            return Decomposition(*(t.to(out_dtype) if t is not None else None
                                   for t in (dec.eigvecs, dec.eigvals, dec.inverse)))
        logger.warning("K-FAC: %s decomposition in %s is not finite", name, dtype)
    logger.warning("K-FAC: keeping the previous decomposition of %s", name)
    return None
