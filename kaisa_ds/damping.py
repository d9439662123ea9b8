"""Damping, in one place: the options that set it and contradict each other, the value in force at a step
(:class:`Damping`), its defaults, and the shift it adds to each layer's curvature, absolute or relative to it.

Relative damping ``r`` makes the damping scale with the curvature it damps, so that multiplying the loss by any
``c`` (which multiplies G by ``c²`` and leaves A alone) multiplies every preconditioned gradient by ``1/c²`` and
leaves its direction unchanged:

* eigen method, ``1 / (λ_G λ_Aᵀ + γ)``: ``γ = r · mean(λ_A) · mean(λ_G)``, ``r`` times the mean eigenvalue of
  ``A ⊗ G`` (``mean(λ) = trace / dim``);
* inverse method, ``(G + γ_G I)⁻¹ ∇ (A + γ_A I)⁻¹``: the same ``γ`` split between the factors as Martens & Grosse
  (2015, §6.3) split it with π: ``γ_A = √r · mean(λ_A)``, ``γ_G = √r · mean(λ_G)`` (so ``γ_A γ_G = γ``).

Diagonal factors (embedding inputs) use the mean of their diagonal. Absolute damping adds the value as given
(eigen: ``γ``; inverse: ``γ`` to each factor), which is the library's behaviour before relative damping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kaisa_ds.enums import DampingMode, parse_enum

# Relative damping when none is given, × each layer's mean eigenvalue of A ⊗ G: 100 for KAISA's ungrafted step (the
# tuned dampings: ~95 at large batch, ~6e4 small, results/damping_scale.json); 10 under grafting (defaults_rule_7.md).
DEFAULT_RELATIVE_DAMPING = 100.0
GRAFTED_RELATIVE_DAMPING = 10.0
DEFAULT_ABSOLUTE_DAMPING = 0.001  # ``damping_mode="absolute"`` without ``damping``: the old library default


@dataclass(frozen=True)
class Damping:
    """The damping in force at one step: its value and what it is measured against (:class:`DampingMode`); how it
    shifts each layer's curvature is :func:`eigen_shift` and :func:`factor_shift`."""

    mode: DampingMode
    value: float

    @property
    def relative(self) -> bool:
        return self.mode is DampingMode.RELATIVE

    def describe(self) -> str:
        return (f"relative_damping={self.value:g} (× each layer's mean eigenvalue of A ⊗ G)" if self.relative
                else f"damping={self.value:g} (absolute)")


def damping_conflict(damping: Any, relative: Any, mode: Any, *, prefix: str) -> str | None:
    """Why the damping options given contradict each other (None when they do not); names ``prefix + key``."""
    if damping is not None and relative is not None:
        return (f"{prefix}damping and {prefix}relative_damping are both given: {prefix}damping is absolute, "
                f"{prefix}relative_damping is relative to each layer's curvature scale; keep one of them")
    try:
        parsed = parse_enum(DampingMode, mode, name="damping_mode") if mode else None
    except ValueError:
        parsed = None  # not a mode at all: the field's own check names it
    if parsed is DampingMode.RELATIVE and damping is not None:
        return (f"{prefix}damping_mode='relative' with {prefix}damping given ({prefix}damping is absolute): give "
                f"{prefix}relative_damping instead, or drop {prefix}damping_mode")
    if parsed is DampingMode.ABSOLUTE and relative is not None:
        return (f"{prefix}damping_mode='absolute' with {prefix}relative_damping given: give {prefix}damping "
                f"instead, or drop {prefix}damping_mode")
    return None


FLOOR = 1e-30  # the smallest shift: an all-zero factor still gets a finite preconditioner


def eigen_shift(damping: Damping, lam_g: torch.Tensor, lam_a: torch.Tensor) -> torch.Tensor:
    """``γ`` per layer, shaped ``(L, 1, 1)``, for eigenvalues ``lam_g`` ``(L, out)`` and ``lam_a`` ``(L, in)``."""
    if not damping.relative:
        return torch.full((lam_g.shape[0], 1, 1), damping.value, dtype=lam_g.dtype, device=lam_g.device)
    gamma = damping.value * lam_g.mean(-1) * lam_a.mean(-1)
    return gamma.clamp_min(FLOOR).view(-1, 1, 1)


def factor_shift(damping: Damping, factor: torch.Tensor, *, diagonal: bool) -> torch.Tensor | float:
    """What the inverse method adds to the diagonal of ``factor`` (``(n,)``, ``(n, n)`` or a batch of them);
    a tensor that broadcasts against it, or the absolute value."""
    if not damping.relative:
        return damping.value
    mean = factor.mean(-1) if diagonal else factor.diagonal(dim1=-2, dim2=-1).mean(-1)
    shift = (math.sqrt(damping.value) * mean).clamp_min(FLOOR)
    return shift.unsqueeze(-1) if diagonal else shift.unsqueeze(-1).unsqueeze(-1)


def in_force(mode: DampingMode, *, given: float | None, grafted: bool) -> Damping:
    """The damping in force in ``mode``: the value ``given`` (already range-checked), else the mode's default
    (relative: :data:`GRAFTED_RELATIVE_DAMPING` under grafting, :data:`DEFAULT_RELATIVE_DAMPING` without)."""
    if given is None:
        given = (DEFAULT_ABSOLUTE_DAMPING if mode is DampingMode.ABSOLUTE
                 else GRAFTED_RELATIVE_DAMPING if grafted else DEFAULT_RELATIVE_DAMPING)
    return Damping(mode, float(given))


DampingLike = float | Damping  # a bare number is absolute damping


def as_damping(damping: DampingLike) -> Damping:
    return damping if isinstance(damping, Damping) else Damping(DampingMode.ABSOLUTE, float(damping))
