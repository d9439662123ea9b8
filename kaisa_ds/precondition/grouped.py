"""``(A ⊗ G + γ·I)⁻¹ vec(∇)`` for layers in groups of equal shapes, with batched matmuls and cached
eigenvalue denominators.

Eigen method: ``Q_G [(Q_Gᵀ ∇ Q_A) / (λ_G λ_Aᵀ + γ)] Q_Aᵀ``. Inverse method: ``(G + γ_G·I)⁻¹ ∇
(A + γ_A·I)⁻¹`` (the shifts were added at decomposition). ``γ`` is per layer: absolute, or relative to the
layer's own eigenvalues (:mod:`kaisa_ds.decomposition.damping`).
Diagonal factors (embedding inputs) have no eigenvectors: their rotation is the identity.

Between two decompositions only the gradients change, so everything else a step needs is built once:
layers with the same (out, in) shape and factor kinds are stacked into one group, their eigenvector (or
inverse) matrices into one ``(L, n, n)`` tensor, and for the eigen method ``1 / (λ_G λ_Aᵀ + γ)`` into one
``(L, out, in)`` tensor. A step is then four (eigen) or two (inverse) batched matmuls and one multiply per group,
with no host sync. Layers that share an A factor (a transformer's query/key/value) are multiplied by it as one
taller matrix ``[∇Q; ∇K; ∇V] Q_A``, so a shared factor is stacked once. The decompositions' own tensors are
re-pointed at views of the stacks (eigenvalues too), so the stacks do not double their memory and no received
broadcast buffer outlives its step.

On a GPU, a dense A factor whose size is not a multiple of :data:`ALIGN` (a bias column makes BERT's 1024 and 4096
into 1025 and 4097) is zero-padded in the stack, and the gradients with it: cuBLAS's fast half-precision kernels
need 16-byte-aligned rows, and ``[∇, 0] [[Q, 0], [0, 0]] = [∇Q, 0]`` keeps the result exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kaisa_ds.config import Damping
from kaisa_ds.decomposition.damping import eigen_shift
from kaisa_ds.decomposition.decompose import Decomposition, stack_views

Pair = tuple[Decomposition, Decomposition]  # (A, G)
ALIGN = 8  # elements: 16 bytes of FP16/BF16, what cuBLAS's tensor-core kernels want of every row


@dataclass
class _Group:
    layers: list[str]  # ordered so that the ``share`` layers of one A factor are adjacent
    share: int  # layers per A factor in this group
    g_mats: torch.Tensor  # (L, out, out): G eigenvectors, or G's damped inverse
    a_mats: torch.Tensor | None  # (L / share, in, in); None for a diagonal A factor
    scale: torch.Tensor  # eigen: 1 / (λ_G λ_Aᵀ + γ), (L, out, in + pad); inverse: A's diagonal inverse, (L, 1, in)
    shift: torch.Tensor | None = None  # eigen: γ per layer, (L, 1, 1)
    pad: int = 0  # zero columns appended to the gradients (and to the A stacks) for aligned matmuls

    def a_side(self, v: torch.Tensor, *, transpose: bool) -> torch.Tensor:
        """``v @ A`` (or ``Aᵀ``) per layer, the layers sharing an A factor stacked into one taller matrix."""
        assert self.a_mats is not None
        a = self.a_mats.transpose(1, 2) if transpose else self.a_mats
        n_layers, rows, cols = v.shape
        return (v.reshape(n_layers // self.share, self.share * rows, cols) @ a).reshape(n_layers, rows, cols)


def _key(a: Decomposition, g: Decomposition) -> tuple[object, ...]:
    # a diagonal A (embeddings) has eigenvalues but no eigenvectors: its size is in the eigenvalues
    mats = (g.eigvecs, a.eigvecs, a.eigvals) if g.eigvals is not None else (g.inverse, a.inverse)
    return tuple((tuple(t.shape), t.dtype, t.device) if t is not None else None for t in mats) + (
        a.eigvecs is None and a.inverse is not None and a.inverse.dim() == 1,)


class GroupedPreconditioner:
    """Applies ``(A ⊗ G + γ·I)⁻¹`` to many layers' gradient matrices at once."""

    def __init__(self, *, eigen: bool, align: int | None = None) -> None:
        self.eigen = eigen
        self.align = align  # pad dense A sizes to a multiple of this; None: ALIGN on a GPU, none on the CPU
        self._groups: list[_Group] | None = None
        self._damping: Damping | None = None  # the eigen denominators follow the damping (value and mode)

    def invalidate(self) -> None:
        """Forget the groups (call after any decomposition changes)."""
        self._groups, self._damping = None, None

    def nbytes(self) -> int:
        """Bytes of the cached denominators (the stacked matrices are the decompositions' own storage)."""
        return sum(g.scale.numel() * g.scale.element_size() for g in self._groups or [])

    def shifts(self) -> dict[str, torch.Tensor]:
        """Eigen method: the damping ``γ`` of each layer in the cached groups (0-d tensors; no sync)."""
        return {n: gamma for g in self._groups or [] if g.shift is not None
                for n, gamma in zip(g.layers, g.shift.float().reshape(-1).unbind(0))}

    def _build(self, pairs: dict[str, Pair], damping: Damping) -> list[_Group]:
        readers: dict[int, list[str]] = {}  # A decomposition -> the layers that read it, in order
        for name, (a, _) in pairs.items():
            readers.setdefault(id(a), []).append(name)
        by_key: dict[tuple[object, ...], list[list[str]]] = {}
        for names in readers.values():
            a, g = pairs[names[0]]
            by_key.setdefault((*_key(a, g), len(names)), []).append(names)
        return [self._group(runs, pairs, damping) for runs in by_key.values()]

    def _pad(self, a: Decomposition) -> int:
        """Zero rows and columns that align a dense A factor's size (0 for a diagonal A)."""
        mat = a.eigvecs if self.eigen else a.inverse
        if mat is None or mat.dim() != 2:
            return 0
        align = self.align if self.align is not None else (ALIGN if mat.is_cuda else 1)
        return -mat.shape[-1] % align

    def _group(self, runs: list[list[str]], pairs: dict[str, Pair], damping: Damping) -> _Group:
        names = [n for run in runs for n in run]
        a_decs, g_decs = [pairs[run[0]][0] for run in runs], [pairs[n][1] for n in names]
        pad = self._pad(a_decs[0])
        if self.eigen:
            g_mats = stack_views(g_decs, "eigvecs")
            a_mats = stack_views(a_decs, "eigvecs", pad=pad) if a_decs[0].eigvecs is not None else None
            lam_g = stack_views(g_decs, "eigvals")
            lam_a = stack_views(a_decs, "eigvals").repeat_interleave(len(runs[0]), 0)
            shift = eigen_shift(damping, lam_g, lam_a)
            scale = torch.baddbmm(shift, lam_g.unsqueeze(2), lam_a.unsqueeze(1)).reciprocal_()
            scale = torch.nn.functional.pad(scale, (0, pad)) if pad else scale  # padded columns stay zero
            return _Group(layers=names, share=len(runs[0]), g_mats=g_mats, a_mats=a_mats, scale=scale, shift=shift,
                          pad=pad)
        g_mats = stack_views(g_decs, "inverse")
        dense_a = a_decs[0].inverse is not None and a_decs[0].inverse.dim() == 2
        a_mats = stack_views(a_decs, "inverse", pad=pad) if dense_a else None
        scale = (torch.ones((), dtype=g_mats.dtype, device=g_mats.device) if dense_a
                 else stack_views(a_decs, "inverse").repeat_interleave(len(runs[0]), 0).unsqueeze(1))
        return _Group(layers=names, share=len(runs[0]), g_mats=g_mats, a_mats=a_mats, scale=scale, pad=pad)

    def apply(self, grads: dict[str, torch.Tensor], pairs: dict[str, Pair], *,
              damping: Damping) -> dict[str, torch.Tensor]:
        """Preconditioned FP32 gradients of the layers in ``pairs`` (all must be in ``grads``)."""
        if not pairs:
            return {}
        stale = self._groups is None or {n for g in self._groups for n in g.layers} != set(pairs)
        if stale or (self.eigen and damping != self._damping):
            self._groups, self._damping = self._build(pairs, damping), damping
        assert self._groups is not None
        out: dict[str, torch.Tensor] = {}
        for group in self._groups:
            v = torch.stack([grads[n] for n in group.layers]).to(group.g_mats.dtype)
            if group.pad:
                v = torch.nn.functional.pad(v, (0, group.pad))
            if self.eigen:
                v = group.g_mats.transpose(1, 2) @ v
                if group.a_mats is not None:
                    v = group.a_side(v, transpose=False)
                v = v * group.scale
                if group.a_mats is not None:
                    v = group.a_side(v, transpose=True)
                v = group.g_mats @ v
            else:
                v = group.g_mats @ v
                v = group.a_side(v, transpose=False) if group.a_mats is not None else v * group.scale
            if group.pad:
                v = v[..., :-group.pad]
            out.update(zip(group.layers, v.float().unbind(0)))
        return out
