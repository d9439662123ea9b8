"""What divides a gradient rotated into K-FAC's eigenbasis, ``Q_Gᵀ ∇ Q_A``, entry by entry, before it is rotated back
(:class:`~kaisa_ds.enums.Eigenvalues`).

:class:`KroneckerScaling` is K-FAC's: ``1 / (λ_G,i λ_A,j + γ)``, the Kronecker product's estimate of each entry's
second moment, damped; built once per decomposition (and damping value) and multiplied every step.

:class:`AdaptiveScaling` measures that second moment instead: a running average ``v`` of the rotated entries'
squares, and divides by ``√v̂`` (bias-corrected), plus a floor of :data:`RELATIVE_FLOOR` times the layer's mean
root. This is EKFAC's eigenvalue correction (George et al. 2018) with Adam's root, as SOAP (Vyas et al. 2024) runs
Adam's second moment in Shampoo's eigenbasis. Each entry of the step then has about unit size in K-FAC's basis;
rotated back, about unit size in the parameters' basis too, so an Adam-family optimizer after it (LAMB) sees a
steady scale instead of a second normalisation working against the first. ``v`` is the only state: one float per
weight of each layer this rank preconditions, kept across decompositions (a new basis keeps the averages, as SOAP
keeps its second moments) and in checkpoints (:meth:`AdaptiveScaling.export`). No damping: the floor is
scale-free, so the direction does not depend on the loss's scale either.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from kaisa_ds.damping import Damping, eigen_shift
from kaisa_ds.decomposition.method import Stacks
from kaisa_ds.enums import Eigenvalues

DECAY = 0.99  # v's running-average decay per preconditioned step (amendment 8 of docs/studies/batch_scaling.md)
RELATIVE_FLOOR = 1e-3  # added to √v̂, times the layer's mean √v̂: a floor that has no units
Group = tuple[str, ...]


class EigenScaling(ABC):
    """One way of scaling the rotated gradients of a group of stacked layers."""

    kind: ClassVar[Eigenvalues]

    @abstractmethod
    def prepare(self, stacks: Stacks, damping: Damping) -> None:
        """Fill what :meth:`scale` needs of the group's decompositions (once per decomposition and damping value);
        sets ``stacks.shift``, the damping each layer's effectiveness figures are measured against."""

    @abstractmethod
    def scale(self, stacks: Stacks, rotated: torch.Tensor) -> torch.Tensor:
        """The group's ``(L, out, in)`` rotated gradients scaled (called once per preconditioned step)."""

    def export(self) -> dict[str, dict[str, Any]]:
        """Per layer, the state a checkpoint keeps (none by default)."""
        return {}

    def load(self, saved: Mapping[str, Mapping[str, Any]]) -> None:
        """Replace the state with ``saved`` (:meth:`export`'s format); nothing to load by default."""
        return None

    def nbytes(self) -> int:
        """Bytes of the state kept between steps."""
        return 0


class KroneckerScaling(EigenScaling):
    kind = Eigenvalues.KRONECKER

    def prepare(self, stacks: Stacks, damping: Damping) -> None:
        assert stacks.g_vec is not None and stacks.a_vec is not None
        lam_g, lam_a = stacks.g_vec, stacks.a_vec.repeat_interleave(stacks.share, 0)
        stacks.shift = eigen_shift(damping, lam_g, lam_a)
        scale = torch.baddbmm(stacks.shift, lam_g.unsqueeze(2), lam_a.unsqueeze(1)).reciprocal_()
        stacks.scale = torch.nn.functional.pad(scale, (0, stacks.pad)) if stacks.pad else scale  # padding stays 0

    def scale(self, stacks: Stacks, rotated: torch.Tensor) -> torch.Tensor:
        assert stacks.scale is not None
        return rotated * stacks.scale


class AdaptiveScaling(EigenScaling):
    kind = Eigenvalues.ADAPTIVE

    def __init__(self, *, decay: float = DECAY, floor: float = RELATIVE_FLOOR) -> None:
        self.decay, self.floor = decay, floor
        self._second: dict[Group, torch.Tensor] = {}  # a group's layers -> their v, stacked (L, out, in + pad)
        self._count: dict[Group, int] = {}  # a group's layers -> the steps their v has averaged
        self._pad: dict[Group, int] = {}  # a group's layers -> the zero columns its stack carries (GPU alignment)
        self._loose: dict[str, tuple[torch.Tensor, int]] = {}  # loaded rows no group has taken yet

    def prepare(self, stacks: Stacks, damping: Damping) -> None:
        assert stacks.g_vec is not None
        stacks.shift = torch.zeros((stacks.g_vec.shape[0], 1, 1), dtype=stacks.g_vec.dtype,
                                   device=stacks.g_vec.device)  # no damping: the effectiveness check's share is 0

    def _row(self, name: str) -> tuple[torch.Tensor, int] | None:
        """A layer's ``v`` (without padding columns) and its count, wherever it is kept."""
        if name in self._loose:
            return self._loose[name]
        for group, stack in self._second.items():
            if name in group:
                row = stack[group.index(name)]
                return row[:, :row.shape[-1] - self._pad[group]], self._count[group]
        return None

    def _state(self, group: Group, like: torch.Tensor, pad: int) -> torch.Tensor:
        """The group's ``v``; a group seen for the first time takes its layers' rows from earlier groups or a
        loaded state (zeros for a layer that has none)."""
        state = self._second.get(group)
        if state is not None and state.shape == like.shape:
            return state
        state = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
        count = 0
        for i, name in enumerate(group):
            row = self._row(name)
            if row is not None and tuple(row[0].shape) == (state.shape[-2], state.shape[-1] - pad):
                state[i, :, :state.shape[-1] - pad].copy_(row[0])
                count = max(count, row[1])
        for name in group:
            self._loose.pop(name, None)
        for old in [g for g in self._second if set(g) & set(group)]:  # groups this one replaces
            for name in set(old) - set(group):  # a layer leaving its group keeps its averages for a later one
                row = self._row(name)
                assert row is not None
                self._loose[name] = (row[0].clone(), row[1])
            del self._second[old], self._count[old], self._pad[old]
        self._second[group], self._count[group], self._pad[group] = state, count, pad
        return state

    def scale(self, stacks: Stacks, rotated: torch.Tensor) -> torch.Tensor:
        group = tuple(stacks.layers)
        wide = rotated.float()
        second = self._state(group, wide, stacks.pad)
        square = wide.square()
        # a non-finite step (the optimizer skips it) must not poison the averages: its entries keep their old v
        second.mul_(self.decay).add_(torch.where(torch.isfinite(square), square, second), alpha=1 - self.decay)
        self._count[group] = count = self._count[group] + 1
        root = (second / (1 - self.decay**count)).sqrt_()
        real = root.shape[-2] * (root.shape[-1] - stacks.pad)  # padding columns are zeros: not in the mean
        mean = root.sum(dim=(1, 2), keepdim=True) / real
        root.add_(self.floor * mean.clamp_min(torch.finfo(torch.float32).tiny))
        return (wide / root).to(rotated.dtype)

    def export(self) -> dict[str, dict[str, Any]]:
        names = {name for group in self._second for name in group} | set(self._loose)
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(names):
            row = self._row(name)
            assert row is not None
            out[name] = {"second": row[0].detach().cpu().clone(), "count": row[1]}
        return out

    def load(self, saved: Mapping[str, Mapping[str, Any]]) -> None:
        self._second, self._count, self._pad = {}, {}, {}
        self._loose = {name: (entry["second"], int(entry["count"])) for name, entry in saved.items()}

    def nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self._second.values())


SCALINGS: dict[Eigenvalues, type[EigenScaling]] = {Eigenvalues.KRONECKER: KroneckerScaling,
                                                   Eigenvalues.ADAPTIVE: AdaptiveScaling}
