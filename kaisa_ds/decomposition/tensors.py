"""The record of one factor's decomposition, and the stacks that make many of them one tensor.

:class:`Decomposition` holds what a method computed (:mod:`kaisa_ds.decomposition.method`): eigenvectors and
eigenvalues, or a damped inverse. :func:`stack_views` stacks many of them into the one ``(L, n, n)`` tensor the
grouped preconditioner multiplies by and points each at its slot, so the stack is their only copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class Decomposition:
    """Eigenbasis methods: ``F = Q diag(λ) Qᵀ`` (Q is None for a diagonal factor). Inverse method:
    ``inverse = (F + γ·I)⁻¹`` (a vector for a diagonal factor), ``γ`` from :func:`~kaisa_ds.damping.factor_shift`."""

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
