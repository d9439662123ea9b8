"""``(A ⊗ G + γ·I)⁻¹ vec(∇)`` for layers in groups of equal shapes, with batched matmuls and cached
eigenvalue denominators.

Eigen method: ``Q_G [(Q_Gᵀ ∇ Q_A) / (λ_G λ_Aᵀ + γ)] Q_Aᵀ``. Inverse method: ``(G + γ_G·I)⁻¹ ∇
(A + γ_A·I)⁻¹`` (the shifts were added at decomposition). ``γ`` is per layer: absolute, or relative to the
layer's own eigenvalues (:mod:`kaisa_ds.damping`).
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

from kaisa_ds.damping import Damping, eigen_shift
from kaisa_ds.decomposition.decompose import Decomposition, stack_views

Pair = tuple[Decomposition, Decomposition]  # (A, G)
_AStack = tuple[torch.Tensor | None, torch.Tensor | None]  # A's stacked matrices, and its eigenvalues or vector
ALIGN = 8  # elements: 16 bytes of FP16/BF16, what cuBLAS's tensor-core kernels want of every row


@dataclass
class _Group:
    layers: list[str]  # ordered so that the ``share`` layers of one A factor are adjacent
    share: int  # layers per A factor in this group
    g_mats: torch.Tensor | None  # (L, out, out): G eigenvectors, or G's damped inverse; None for a diagonal G
    a_mats: torch.Tensor | None  # (L / share, in, in); None for a diagonal A factor
    scale: torch.Tensor  # eigen: 1 / (λ_G λ_Aᵀ + γ), (L, out, in + pad); inverse: A's diagonal inverse, (L, 1, in)
    dtype: torch.dtype  # what the decompositions are applied in
    shift: torch.Tensor | None = None  # eigen: γ per layer, (L, 1, 1)
    g_vec: torch.Tensor | None = None  # inverse, diagonal G: its damped inverse, (L, out, 1)
    pad: int = 0  # zero columns appended to the gradients (and to the A stacks) for aligned matmuls

    def g_side(self, v: torch.Tensor, *, transpose: bool) -> torch.Tensor:
        """``G v`` (or ``Gᵀ v``) per layer: a matmul, a row scaling for an inverse diagonal G, nothing for the
        eigenvectors of a diagonal G (the identity)."""
        if self.g_mats is not None:
            return (self.g_mats.transpose(1, 2) if transpose else self.g_mats) @ v
        return v * self.g_vec if self.g_vec is not None else v

    def a_side(self, v: torch.Tensor, *, transpose: bool) -> torch.Tensor:
        """``v @ A`` (or ``Aᵀ``) per layer, the layers sharing an A factor stacked into one taller matrix."""
        assert self.a_mats is not None
        a = self.a_mats.transpose(1, 2) if transpose else self.a_mats
        n_layers, rows, cols = v.shape
        return (v.reshape(n_layers // self.share, self.share * rows, cols) @ a).reshape(n_layers, rows, cols)


def _shape(t: torch.Tensor | None) -> tuple[object, ...] | None:
    return None if t is None else (tuple(t.shape), t.dtype, t.device)


def _a_key(a: Decomposition) -> tuple[object, ...]:
    """What layers sharing one stack of A matrices must agree on (a diagonal A has only eigenvalues or a vector)."""
    return (_shape(a.eigvecs), _shape(a.eigvals), _shape(a.inverse))


def _g_key(g: Decomposition) -> tuple[object, ...]:
    return (_shape(g.eigvecs), _shape(g.eigvals), _shape(g.inverse))


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
        """Groups of stackable layers. Layers reading one A factor may differ in output size (grouped-query
        attention's narrower key and value, an MLP reading the attention's input in parallel): they are split into
        runs of one G size, and runs of equal (A, G, length) across the model form a group."""
        readers: dict[int, list[str]] = {}  # A decomposition -> the layers that read it, in order
        for name, (a, _) in pairs.items():
            readers.setdefault(id(a), []).append(name)
        by_key: dict[tuple[object, ...], list[list[str]]] = {}
        for names in readers.values():
            runs: dict[tuple[object, ...], list[str]] = {}
            for name in names:
                runs.setdefault(_g_key(pairs[name][1]), []).append(name)
            a_key = _a_key(pairs[names[0]][0])
            for g_key, run in runs.items():
                by_key.setdefault((a_key, g_key, len(run)), []).append(run)
        a_stacks: dict[tuple[object, ...], _AStack] = {}
        return [self._group(runs, pairs, damping, a_stacks) for runs in by_key.values()]

    def _pad(self, a: Decomposition) -> int:
        """Zero rows and columns that align a dense A factor's size (0 for a diagonal A)."""
        mat = a.eigvecs if self.eigen else a.inverse
        if mat is None or mat.dim() != 2:
            return 0
        align = self.align if self.align is not None else (ALIGN if mat.is_cuda else 1)
        return -mat.shape[-1] % align

    def _a_stack(self, a_decs: list[Decomposition], pad: int,
                 cache: dict[tuple[object, ...], _AStack]) -> _AStack:
        """The A side's stacked matrices (None for a diagonal A) and its eigenvalues (eigen) or diagonal inverse.
        Groups of the same A factors in the same order (grouped-query attention's query group and its key/value
        group) share one stack, so an A factor read by layers of two output sizes is not stored twice."""
        key = (pad, *(id(d) for d in a_decs))
        if key not in cache:
            attr = "eigvecs" if self.eigen else "inverse"
            first = getattr(a_decs[0], attr)
            dense = first is not None and first.dim() == 2
            mats = stack_views(a_decs, attr, pad=pad) if dense else None
            vec = stack_views(a_decs, "eigvals") if self.eigen else None if dense else stack_views(a_decs, attr)
            cache[key] = (mats, vec)
        return cache[key]

    def _group(self, runs: list[list[str]], pairs: dict[str, Pair], damping: Damping,
               a_stacks: dict[tuple[object, ...], _AStack]) -> _Group:
        names = [n for run in runs for n in run]
        share = len(runs[0])
        a_decs, g_decs = [pairs[run[0]][0] for run in runs], [pairs[n][1] for n in names]
        pad = self._pad(a_decs[0])
        a_mats, a_vec = self._a_stack(a_decs, pad, a_stacks)
        if self.eigen:
            assert a_vec is not None
            g_mats = stack_views(g_decs, "eigvecs") if g_decs[0].eigvecs is not None else None
            lam_g = stack_views(g_decs, "eigvals")
            lam_a = a_vec.repeat_interleave(share, 0)
            shift = eigen_shift(damping, lam_g, lam_a)
            scale = torch.baddbmm(shift, lam_g.unsqueeze(2), lam_a.unsqueeze(1)).reciprocal_()
            scale = torch.nn.functional.pad(scale, (0, pad)) if pad else scale  # padded columns stay zero
            return _Group(layers=names, share=share, g_mats=g_mats, a_mats=a_mats, scale=scale, dtype=lam_g.dtype,
                          shift=shift, pad=pad)
        g_inv = stack_views(g_decs, "inverse")
        dense_g = g_inv.dim() == 3
        if a_vec is None:
            scale = torch.ones((), dtype=g_inv.dtype, device=g_inv.device)
        else:  # a diagonal A: its damped inverse is a vector
            scale = a_vec.repeat_interleave(share, 0).unsqueeze(1)
        return _Group(layers=names, share=share, g_mats=g_inv if dense_g else None, a_mats=a_mats, scale=scale,
                      dtype=g_inv.dtype, g_vec=None if dense_g else g_inv.unsqueeze(2), pad=pad)

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
            v = torch.stack([grads[n] for n in group.layers]).to(group.dtype)
            if group.pad:
                v = torch.nn.functional.pad(v, (0, group.pad))
            if self.eigen:
                v = group.g_side(v, transpose=True)
                if group.a_mats is not None:
                    v = group.a_side(v, transpose=False)
                v = v * group.scale
                if group.a_mats is not None:
                    v = group.a_side(v, transpose=True)
                v = group.g_side(v, transpose=False)
            else:
                v = group.g_side(v, transpose=False)
                v = group.a_side(v, transpose=False) if group.a_mats is not None else v * group.scale
            if group.pad:
                v = v[..., :-group.pad]
            out.update(zip(group.layers, v.float().unbind(0)))
        return out
