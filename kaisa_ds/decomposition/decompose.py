"""Decompose factors with any method, batched by size, with an FP64 retry and a keep-previous fallback.

Factors may be stored in FP16/BF16; they are cast to FP32 (or FP64 on request) here and the result is stored in
``inv_dtype``. Factors of one size are decomposed in one batched call with one finiteness check (one host sync per
size, not per factor). A decomposition that raises or returns non-finite values is retried alone in FP64; if that
also fails the caller keeps its previous decomposition (``None`` is returned), so a bad factor never crashes
training. What a decomposition is and how it is applied is its method's (:func:`method_for`); these functions take
the configured :class:`~kaisa_ds.enums.ComputeMethod` and ask it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from kaisa_ds.damping import Damping, DampingLike, as_damping
from kaisa_ds.decomposition.method import DecompositionMethod
from kaisa_ds.decomposition.registry import method_for
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import ComputeMethod

logger = logging.getLogger(__name__)
MethodLike = ComputeMethod | DecompositionMethod  # the configured kind, or a preconditioner's own instance
BATCH_BYTES = 256 * 2**20  # the most factor bytes stacked into one batched call (a temporary copy)


def layout(dim: int, *, diagonal: bool, method: ComputeMethod) -> list[tuple[int, ...]]:
    """Shapes of :meth:`Decomposition.tensors` for a factor of size ``dim`` (what a receiver allocates)."""
    return method_for(method).layout(dim, diagonal=diagonal)


def from_tensors(tensors: list[torch.Tensor], *, method: ComputeMethod) -> Decomposition:
    """The inverse of :meth:`Decomposition.tensors`."""
    return method_for(method).from_tensors(tensors)


def _cast(dec: Decomposition, dtype: torch.dtype) -> Decomposition:
    return Decomposition(*(t.to(dtype) if t is not None else None for t in (dec.eigvecs, dec.eigvals, dec.inverse)))


def decompose(
    factor: torch.Tensor, *, method: MethodLike, diagonal: bool, damping: DampingLike, compute_dtype: torch.dtype,
    out_dtype: torch.dtype, name: str = "factor", previous: Decomposition | None = None,
) -> Decomposition | None:
    """Decompose one factor; None when both the requested precision and FP64 fail."""
    impl = method_for(method)
    dtypes = [compute_dtype] if compute_dtype == torch.float64 else [compute_dtype, torch.float64]
    for dtype in dtypes:
        try:
            dec = impl.compute(factor, diagonal=diagonal, damping=as_damping(damping), dtype=dtype, previous=previous)
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
    factors: Mapping[str, tuple[torch.Tensor, bool]], *, method: MethodLike, damping: DampingLike,
    compute_dtype: torch.dtype, out_dtype: torch.dtype, previous: Mapping[str, Decomposition] | None = None,
) -> dict[str, Decomposition | None]:
    """Decompose ``{name: (factor, diagonal)}``; dense factors of equal size go through one batched call.
    ``previous``: the decompositions in force, for a method that starts from them.

    A batch that raises or yields any non-finite value falls back to :func:`decompose` per factor, so one bad
    factor costs only its own FP64 retry.
    """
    out: dict[str, Decomposition | None] = {}
    by_dim: dict[int, list[str]] = {}
    previous = previous or {}
    method = method_for(method)  # one instance for every batch: its report is this round's
    method.start_round()
    for name, (value, diagonal) in factors.items():
        if diagonal:
            out[name] = decompose(value, method=method, diagonal=True, damping=damping, compute_dtype=compute_dtype,
                                  out_dtype=out_dtype, name=name)
        else:
            by_dim.setdefault(value.shape[-1], []).append(name)
    for dim, names in by_dim.items():
        for chunk in _batches(names, dim):
            out.update(_decompose_batch(factors, chunk, method=method, damping=as_damping(damping),
                                        compute_dtype=compute_dtype, out_dtype=out_dtype, previous=previous))
    return {name: out[name] for name in factors}


def _stacked_previous(previous: Mapping[str, Decomposition], names: list[str],
                      dtype: torch.dtype) -> Decomposition | None:
    """The batch's decompositions in force as one batched Decomposition (None unless every factor has one)."""
    decs = [previous.get(n) for n in names]
    if any(d is None or d.eigvecs is None or d.eigvals is None for d in decs):
        return None
    return Decomposition(eigvecs=torch.stack([d.eigvecs.to(dtype) for d in decs]),  # type: ignore[union-attr]
                         eigvals=torch.stack([d.eigvals.to(dtype) for d in decs]))  # type: ignore[union-attr]


def _decompose_batch(factors: Mapping[str, tuple[torch.Tensor, bool]], names: list[str], *, method: MethodLike,
                     damping: Damping, compute_dtype: torch.dtype, out_dtype: torch.dtype,
                     previous: Mapping[str, Decomposition]) -> dict[str, Decomposition | None]:
    def one_by_one() -> dict[str, Decomposition | None]:
        return {n: decompose(factors[n][0], method=method, diagonal=False, damping=damping,
                             compute_dtype=compute_dtype, out_dtype=out_dtype, name=n, previous=previous.get(n))
                for n in names}

    if len(names) == 1:
        return one_by_one()
    stacked = torch.stack([factors[n][0].to(compute_dtype) for n in names])
    try:
        dec = method_for(method).compute(stacked, diagonal=False, damping=damping, dtype=compute_dtype,
                                         previous=_stacked_previous(previous, names, compute_dtype))
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
