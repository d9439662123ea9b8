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

Whether K-FAC's damped eigenvalues are in force at all is decided here too (:class:`~kaisa_ds.enums.Eigenvalues`):
``eigenvalues="auto"`` is :data:`DEFAULT_EIGENVALUES`, except where the other options ask for K-FAC's own ``λ_G λ_A
+ γ``: a damping given (``damping``, ``relative_damping`` or ``damping_mode``: only those eigenvalues have a ``γ``),
the inverse method (no eigenbasis to measure in), or a step whose size is K-FAC's own (``grafting="none"``, and
the ``"kfac-size"`` ablation), which only K-FAC's eigenvalues give. So KAISA's recipes keep the step they were
measured with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kaisa_ds.enums import ComputeMethod, DampingMode, Eigenvalues, Grafting, parse_enum

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


AUTO = "auto"
# amendment 8 of docs/studies/batch_scaling.md (six tune cells, both models, 2,048-32,768 tokens): mean gap to a
# tuned LAMB's final -0.10 nats against Kronecker's +0.81, which stayed on the plateau at BERT-mini's large batches
DEFAULT_EIGENVALUES = Eigenvalues.ADAPTIVE


def parse_eigenvalues(value: Any) -> Eigenvalues | str:
    """``value`` as the enum, or ``"auto"``; ValueError naming the allowed values."""
    if value == AUTO:
        return AUTO
    try:
        return parse_enum(Eigenvalues, value, name="eigenvalues")
    except ValueError as exc:
        raise ValueError(f"{exc}, or 'auto' ({DEFAULT_EIGENVALUES.value} unless a damping, the inverse method or "
                         "grafting='none' asks for K-FAC's own)") from None


def _kronecker_because(*, damping_given: bool, method: ComputeMethod | str, grafting: Grafting) -> str | None:
    if damping_given:
        return "a damping is given (damping, relative_damping or damping_mode)"
    if method == ComputeMethod.INVERSE:
        return "compute_method='inverse' has no eigenbasis"
    if grafting in (Grafting.NONE, Grafting.KFAC_SIZE):
        return f"grafting={grafting.value!r} takes the step's size from K-FAC's own eigenvalues"
    return None


def eigenvalues_conflict(value: Eigenvalues | str, *, damping_given: bool, method: ComputeMethod | str,
                         grafting: Grafting, prefix: str = "") -> str | None:
    """Why an explicit ``adaptive`` contradicts the other options (None when it does not, or for any other value)."""
    if value is not Eigenvalues.ADAPTIVE:
        return None
    why = _kronecker_because(damping_given=damping_given, method=method, grafting=grafting)
    if why is None:
        return None
    return (f"{prefix}eigenvalues='adaptive' scales the rotated gradient by its measured second moment, but {why}: "
            f"drop {prefix}eigenvalues (or set it to 'kronecker'), or drop the other option")


def resolve_eigenvalues(value: Eigenvalues | str, *, damping_given: bool, method: ComputeMethod | str,
                        grafting: Grafting) -> Eigenvalues:
    """The scaling in force: ``value``, or for ``"auto"`` the default unless another option asks for Kronecker."""
    if isinstance(value, Eigenvalues):
        return value
    why = _kronecker_because(damping_given=damping_given, method=method, grafting=grafting)
    return Eigenvalues.KRONECKER if why is not None else DEFAULT_EIGENVALUES


def checked_options(config: Any) -> tuple[DampingMode | None, Eigenvalues | str]:
    """A configuration's ``damping_mode`` and ``eigenvalues`` parsed, after checking that its damping options and
    its eigenvalues do not contradict each other (ValueError naming the keys otherwise)."""
    mode = parse_enum(DampingMode, config.damping_mode, name="damping_mode") if config.damping_mode else None
    eigenvalues = parse_eigenvalues(config.eigenvalues)
    damping_given = any(v is not None for v in (config.damping, config.relative_damping, mode))
    conflict = damping_conflict(config.damping, config.relative_damping, mode, prefix="") or eigenvalues_conflict(
        eigenvalues, damping_given=damping_given, method=config.compute_method, grafting=config.grafting)
    if conflict:
        raise ValueError(conflict)
    return mode, eigenvalues


def eigenvalues_in_force(config: Any) -> Eigenvalues:
    """A (checked) configuration's eigenvalues with ``"auto"`` resolved."""
    damping_given = any(v is not None for v in (config.damping, config.relative_damping, config.damping_mode))
    return resolve_eigenvalues(config.eigenvalues, damping_given=damping_given, method=config.compute_method,
                               grafting=config.grafting)
