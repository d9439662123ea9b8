"""``(A ⊗ G + γ·I)⁻¹ vec(∇)`` for layers in groups of equal shapes, with batched matmuls and cached
denominators. What is multiplied, and how, is the decomposition method's (:mod:`kaisa_ds.decomposition.method`):
eigenbasis methods ``Q_G [(Q_Gᵀ ∇ Q_A) / (λ_G λ_Aᵀ + γ)] Q_Aᵀ``, the inverse method ``(G + γ_G·I)⁻¹ ∇ (A + γ_A·I)⁻¹``.

Between two decompositions only the gradients change, so everything else a step needs is built once:
layers with the same (out, in) shape and factor kinds are stacked into one group, their matrices into one
``(L, n, n)`` tensor, and what the method caches (eigen: ``1 / (λ_G λ_Aᵀ + γ)``) into one ``(L, out, in)`` tensor.
A step is then a few batched matmuls and one multiply per group, with no host sync. Layers that share an A factor (a
transformer's query/key/value) are multiplied by it as one taller matrix ``[∇Q; ∇K; ∇V] Q_A``, so a shared factor is
stacked once. The decompositions' own tensors are
re-pointed at views of the stacks (eigenvalues too), so the stacks do not double their memory and no received
broadcast buffer outlives its step.

On a GPU, a dense A factor whose size is not a multiple of :data:`ALIGN` (a bias column makes BERT's 1024 and 4096
into 1025 and 4097) is zero-padded in the stack, and the gradients with it: cuBLAS's fast half-precision kernels
need 16-byte-aligned rows, and ``[∇, 0] [[Q, 0], [0, 0]] = [∇Q, 0]`` keeps the result exact.
"""

from __future__ import annotations

import torch

from kaisa_ds.damping import Damping
from kaisa_ds.decomposition.method import DecompositionMethod, Stacks
from kaisa_ds.decomposition.tensors import Decomposition, stack_views

Pair = tuple[Decomposition, Decomposition]  # (A, G)
ALIGN = 8  # elements: 16 bytes of FP16/BF16, what cuBLAS's tensor-core kernels want of every row
_AStack = tuple[torch.Tensor | None, torch.Tensor | None]  # A's stacked matrices and vectors


def _shape(t: torch.Tensor | None) -> tuple[object, ...] | None:
    return None if t is None else (tuple(t.shape), t.dtype, t.device)


def _key(dec: Decomposition) -> tuple[object, ...]:
    """What decompositions stacked together must agree on."""
    return (_shape(dec.eigvecs), _shape(dec.eigvals), _shape(dec.inverse))


class GroupedPreconditioner:
    """Applies ``(A ⊗ G + γ·I)⁻¹`` to many layers' gradient matrices at once, with ``method``'s decompositions."""

    def __init__(self, method: DecompositionMethod, *, align: int | None = None) -> None:
        self.method = method
        self.align = align  # pad dense A sizes to a multiple of this; None: ALIGN on a GPU, none on the CPU
        self._groups: list[Stacks] | None = None
        self._damping: Damping | None = None  # cached denominators may follow the damping (value and mode)

    def invalidate(self) -> None:
        """Forget the groups (call after any decomposition changes)."""
        self._groups, self._damping = None, None

    def nbytes(self) -> int:
        """Bytes of the cached denominators and of the method's state between steps (the stacked matrices are the
        decompositions' own storage)."""
        cached = sum(g.scale.numel() * g.scale.element_size() for g in self._groups or [] if g.scale is not None)
        return cached + self.method.state_nbytes()

    def shifts(self) -> dict[str, torch.Tensor] | None:
        """The damping ``γ`` of each layer in the cached groups (0-d tensors; no sync), where the method applies it
        at preconditioning; None for a method damped at decomposition (its shifts are in its factors)."""
        if self.method.damped_at_decomposition:
            return None
        return {n: gamma for g in self._groups or [] if g.shift is not None
                for n, gamma in zip(g.layers, g.shift.float().reshape(-1).unbind(0))}

    def _build(self, pairs: dict[str, Pair], damping: Damping) -> list[Stacks]:
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
                runs.setdefault(_key(pairs[name][1]), []).append(name)
            a_key = _key(pairs[names[0]][0])
            for g_key, run in runs.items():
                by_key.setdefault((a_key, g_key, len(run)), []).append(run)
        a_stacks: dict[tuple[object, ...], _AStack] = {}
        return [self._group(runs, pairs, damping, a_stacks) for runs in by_key.values()]

    def _pad(self, a: Decomposition) -> int:
        """Zero rows and columns that align a dense A factor's size (0 for a diagonal A)."""
        mat = getattr(a, self.method.matrix)
        if mat is None or mat.dim() != 2:
            return 0
        align = self.align if self.align is not None else (ALIGN if mat.is_cuda else 1)
        return -mat.shape[-1] % align

    def _stack(self, decs: list[Decomposition], pad: int = 0) -> _AStack:
        """The matrices (2-D) and vectors (1-D) of ``decs`` as stacks their decompositions point into."""
        mat, vec = getattr(decs[0], self.method.matrix), getattr(decs[0], self.method.vector)
        mats = stack_views(decs, self.method.matrix, pad=pad) if mat is not None and mat.dim() == 2 else None
        vecs = stack_views(decs, self.method.vector) if vec is not None and vec.dim() == 1 else None
        return mats, vecs

    def _group(self, runs: list[list[str]], pairs: dict[str, Pair], damping: Damping,
               a_stacks: dict[tuple[object, ...], _AStack]) -> Stacks:
        """One group's stacks, prepared by the method. Groups of the same A factors in the same order (grouped-
        query attention's query group and its key/value group) share one A stack, so an A factor read by layers of
        two output sizes is not stored twice."""
        names = [n for run in runs for n in run]
        a_decs, g_decs = [pairs[run[0]][0] for run in runs], [pairs[n][1] for n in names]
        pad = self._pad(a_decs[0])
        key = (pad, *(id(d) for d in a_decs))
        if key not in a_stacks:
            a_stacks[key] = self._stack(a_decs, pad)
        a_mat, a_vec = a_stacks[key]
        g_mat, g_vec = self._stack(g_decs)
        dtype = next(t.dtype for t in (g_mat, g_vec) if t is not None)
        stacks = Stacks(layers=names, share=len(runs[0]), g_mat=g_mat, g_vec=g_vec, a_mat=a_mat, a_vec=a_vec,
                        dtype=dtype, pad=pad)
        self.method.prepare(stacks, damping)
        return stacks

    def apply(self, grads: dict[str, torch.Tensor], pairs: dict[str, Pair], *,
              damping: Damping) -> dict[str, torch.Tensor]:
        """Preconditioned FP32 gradients of the layers in ``pairs`` (all must be in ``grads``)."""
        if not pairs:
            return {}
        stale = self._groups is None or {n for g in self._groups for n in g.layers} != set(pairs)
        if stale or (not self.method.damped_at_decomposition and damping != self._damping):
            self._groups, self._damping = self._build(pairs, damping), damping
        assert self._groups is not None
        out: dict[str, torch.Tensor] = {}
        for group in self._groups:
            v = torch.stack([grads[n] for n in group.layers]).to(group.dtype)
            if group.pad:
                v = torch.nn.functional.pad(v, (0, group.pad))
            v = self.method.apply(group, v)
            if group.pad:
                v = v[..., :-group.pad]
            out.update(zip(group.layers, v.float().unbind(0)))
        return out
