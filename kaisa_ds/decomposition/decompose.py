"""Eigendecompositions and damped inverses of factors, with an FP64 retry and a keep-previous fallback.

Factors may be stored in FP16/BF16; they are cast to FP32 (or FP64 on request) here and the result
is stored in ``inv_dtype``. Factors of one size are decomposed in one batched call with one finiteness
check (one host sync per size, not per factor). A decomposition that raises or returns non-finite values
is retried alone in FP64; if that also fails the caller keeps its previous decomposition (``None`` is
returned), so a bad factor never crashes training. Both methods keep the preconditioner positive definite when
rounding leaves a factor's eigenvalues below zero: the eigen method clamps them at 0, and the inverse method
inverts such a factor through the same clamped eigendecomposition (:func:`spd_inverse`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from kaisa_ds.damping import Damping, factor_shift
from kaisa_ds.enums import ComputeMethod, DampingMode

logger = logging.getLogger(__name__)
BATCH_BYTES = 256 * 2**20  # the most factor bytes stacked into one batched call (a temporary copy)


@dataclass
class Decomposition:
    """Eigen method: ``F = Q diag(λ) Qᵀ`` (Q is None for a diagonal factor).
    Inverse method: ``inverse = (F + γ·I)⁻¹`` (a vector for a diagonal factor), ``γ`` from
    :func:`~kaisa_ds.damping.factor_shift`."""

    eigvecs: torch.Tensor | None = None
    eigvals: torch.Tensor | None = None
    inverse: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.eigvecs, self.eigvals, self.inverse) if t is not None]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def is_finite(self) -> bool:
        return all(bool(torch.isfinite(t).all()) for t in self.tensors())


def stack_views(decs: list[Decomposition], attr: str, *, pad: int = 0) -> torch.Tensor:
    """Stack the ``attr`` tensor (``eigvecs``, ``eigvals`` or ``inverse``) of every decomposition and point each
    decomposition at its slot, so the stack is their one copy (what the grouped preconditioner multiplies by).

    ``pad`` zero-pads every dimension of each slot by that many (the grouped preconditioner aligns odd sizes such
    as a bias-augmented 1025 for the GPU's matmuls); the decompositions then view the unpadded corner."""
    if not pad:
        stacked = torch.stack([getattr(d, attr) for d in decs])
        for i, d in enumerate(decs):
            setattr(d, attr, stacked[i])
        return stacked
    first = getattr(decs[0], attr)
    stacked = first.new_zeros((len(decs), *(n + pad for n in first.shape)))
    for i, d in enumerate(decs):
        tensor = getattr(d, attr)
        slot = stacked[i][tuple(slice(0, n) for n in tensor.shape)]
        slot.copy_(tensor)
        setattr(d, attr, slot)
    return stacked


def storage_bytes(decs: Iterable[Decomposition]) -> int:
    """Bytes of the storage behind ``decs``: views of one stack (:func:`stack_views`) count once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for d in decs for t in d.tensors()}
    return sum(storages.values())


def layout(dim: int, *, diagonal: bool, method: ComputeMethod) -> list[tuple[int, ...]]:
    """Shapes of :meth:`Decomposition.tensors` for a factor of size ``dim`` (what a receiver allocates)."""
    if method is ComputeMethod.EIGEN:
        return [(dim,)] if diagonal else [(dim, dim), (dim,)]
    return [(dim,)] if diagonal else [(dim, dim)]


def from_tensors(tensors: list[torch.Tensor], *, method: ComputeMethod) -> Decomposition:
    """The inverse of :meth:`Decomposition.tensors`."""
    if method is not ComputeMethod.EIGEN:
        return Decomposition(inverse=tensors[0])
    if len(tensors) == 1:
        return Decomposition(eigvecs=None, eigvals=tensors[0])
    return Decomposition(eigvecs=tensors[0], eigvals=tensors[1])


def _eigen(factor: torch.Tensor, dtype: torch.dtype, diagonal: bool) -> Decomposition:
    f = factor.to(dtype)
    if diagonal:
        return Decomposition(eigvecs=None, eigvals=f.clamp(min=0.0))
    vals, vecs = torch.linalg.eigh(f)
    return Decomposition(eigvecs=vecs, eigvals=vals.clamp(min=0.0))


DampingLike = float | Damping  # a bare number is absolute damping


def as_damping(damping: DampingLike) -> Damping:
    return damping if isinstance(damping, Damping) else Damping(DampingMode.ABSOLUTE, float(damping))


def _inverse(factor: torch.Tensor, dtype: torch.dtype, diagonal: bool, damping: DampingLike) -> Decomposition:
    f = factor.to(dtype)
    shift = factor_shift(as_damping(damping), f, diagonal=diagonal)
    if diagonal:
        return Decomposition(inverse=1.0 / (f.clamp(min=0.0) + shift))
    eye = torch.eye(f.shape[-1], dtype=dtype, device=f.device)
    return Decomposition(inverse=spd_inverse(f + shift * eye, shift=shift))


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


def _cast(dec: Decomposition, dtype: torch.dtype) -> Decomposition:
    return Decomposition(*(t.to(dtype) if t is not None else None for t in (dec.eigvecs, dec.eigvals, dec.inverse)))


def decompose(
    factor: torch.Tensor, *, method: ComputeMethod, diagonal: bool, damping: DampingLike, compute_dtype: torch.dtype,
    out_dtype: torch.dtype, name: str = "factor",
) -> Decomposition | None:
    """Decompose one factor; None when both the requested precision and FP64 fail."""
    dtypes = [compute_dtype] if compute_dtype == torch.float64 else [compute_dtype, torch.float64]
    for dtype in dtypes:
        try:
            dec = (_eigen(factor, dtype, diagonal) if method is ComputeMethod.EIGEN
                   else _inverse(factor, dtype, diagonal, damping))
        except (RuntimeError, torch.linalg.LinAlgError) as exc:  # type: ignore[misc]
            logger.warning("K-FAC: %s decomposition failed in %s (%s)", name, dtype, exc)
            continue
        if dec.is_finite():
            return _cast(dec, out_dtype)
        logger.warning("K-FAC: %s decomposition in %s is not finite", name, dtype)
    logger.warning("K-FAC: keeping the previous decomposition of %s", name)
    return None


def _batches(names: list[str], dim: int) -> list[list[str]]:
    per = max(1, BATCH_BYTES // (dim * dim * 4))
    return [names[i:i + per] for i in range(0, len(names), per)]


def decompose_all(
    factors: Mapping[str, tuple[torch.Tensor, bool]], *, method: ComputeMethod, damping: DampingLike,
    compute_dtype: torch.dtype, out_dtype: torch.dtype,
) -> dict[str, Decomposition | None]:
    """Decompose ``{name: (factor, diagonal)}``; dense factors of equal size go through one batched call.

    A batch that raises or yields any non-finite value falls back to :func:`decompose` per factor, so one bad
    factor costs only its own FP64 retry.
    """
    out: dict[str, Decomposition | None] = {}
    by_dim: dict[int, list[str]] = {}
    for name, (value, diagonal) in factors.items():
        if diagonal:
            out[name] = decompose(value, method=method, diagonal=True, damping=damping, compute_dtype=compute_dtype,
                                  out_dtype=out_dtype, name=name)
        else:
            by_dim.setdefault(value.shape[-1], []).append(name)
    for dim, names in by_dim.items():
        for chunk in _batches(names, dim):
            out.update(_decompose_batch(factors, chunk, method=method, damping=damping, compute_dtype=compute_dtype,
                                        out_dtype=out_dtype))
    return {name: out[name] for name in factors}


def _decompose_batch(factors: Mapping[str, tuple[torch.Tensor, bool]], names: list[str], *, method: ComputeMethod,
                     damping: DampingLike, compute_dtype: torch.dtype,
                     out_dtype: torch.dtype) -> dict[str, Decomposition | None]:
    def one_by_one() -> dict[str, Decomposition | None]:
        return {n: decompose(factors[n][0], method=method, diagonal=False, damping=damping,
                             compute_dtype=compute_dtype, out_dtype=out_dtype, name=n) for n in names}

    if len(names) == 1:
        return one_by_one()
    stacked = torch.stack([factors[n][0].to(compute_dtype) for n in names])
    try:
        dec = (_eigen(stacked, compute_dtype, False) if method is ComputeMethod.EIGEN
               else _inverse(stacked, compute_dtype, False, damping))
    except (RuntimeError, torch.linalg.LinAlgError):  # type: ignore[misc]
        return one_by_one()
    del stacked
    if not dec.is_finite():  # one host sync for the whole batch
        return one_by_one()
    dec = _cast(dec, out_dtype)
    if dec.eigvecs is not None and dec.eigvals is not None:
        return {n: Decomposition(eigvecs=dec.eigvecs[i], eigvals=dec.eigvals[i]) for i, n in enumerate(names)}
    assert dec.inverse is not None
    return {n: Decomposition(inverse=dec.inverse[i]) for i, n in enumerate(names)}
