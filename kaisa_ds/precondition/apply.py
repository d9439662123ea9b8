"""The size of the preconditioned step: KAISA's KL clip (one scale for every preconditioned gradient, so the whole
step stays in a trust region) and grafting (each layer's preconditioned gradient at its raw gradient's norm).

Every size a step takes (grafting's ratio per layer, the clip's ν, the loss scale) is folded into one factor per
layer, applied in one batched multiply, so the hot path multiplies each gradient once instead of once per rule.
The preconditioning itself is :mod:`kaisa_ds.precondition.grouped`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kaisa_ds.enums import Grafting


def kl_clip_scale(
    preconditioned: list[torch.Tensor], grads: list[torch.Tensor], *, lr: float, kl_clip: float,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``ν = min(1, sqrt(kl_clip / (lr² · |Σ w_i ⟨P_i, ∇_i⟩|)))`` as a 0-d tensor (no host sync); ``weights`` (one
    per tensor, 1 when None) are factors the step will multiply ``P_i`` by, e.g. grafting's ratios."""
    if not preconditioned:
        return torch.ones(())
    dots = torch.stack([torch.vdot(p.reshape(-1), g.reshape(-1)) for p, g in zip(preconditioned, grads)])
    if weights is not None:
        dots = dots * weights.to(dots.device)
    vg = dots.sum().abs() * (lr**2)
    if lr == 0:
        return torch.ones((), device=vg.device)
    return torch.clamp(torch.sqrt(kl_clip / vg), max=1.0)


def fp32_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor's FP32 norm, batched, no host sync: the step's overflow check (NaN and inf carry through a sum
    of squares; a finite tensor whose FP32 norm overflows counts too, as the step's own norms would overflow on it),
    and grafting's sizes. Half-precision tensors are read in FP32: a finite FP16 tensor's norm may pass FP16's max."""
    if not tensors:
        return torch.zeros(0)
    wide = [t if t.element_size() >= 4 else t.float() for t in tensors]
    return torch.stack(torch._foreach_norm(wide)).float()


def graft_ratios(directions: list[torch.Tensor], sizes: list[torch.Tensor], *,
                 direction_norms: torch.Tensor | None = None, size_norms: torch.Tensor | None = None) -> torch.Tensor:
    """Per tensor (1-d, float32), the factor that brings ``directions[i]`` to the norm of ``sizes[i]``; 1 where its
    own norm is 0 (nothing to scale, and no NaN). Grafting (Agarwal et al. 2020): K-FAC's direction at the
    gradient's size, or, as an ablation, the gradient's direction at K-FAC's size. Batched norms, no host sync;
    norms already taken (the overflow check's, of the gradients) are passed in rather than taken again."""
    own = fp32_norms(directions) if direction_norms is None else direction_norms.float()
    wanted = (fp32_norms(sizes) if size_norms is None else size_norms.float()).to(own.device)
    return torch.where(own > 0, wanted / own, torch.ones_like(own))


def rescale(tensors: list[torch.Tensor], factors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors[i] * factors[i]`` in one batched call; each result keeps its tensor's dtype (a 0-d factor does not
    promote it)."""
    if not tensors:
        return []
    return list(torch._foreach_mul(tensors, list(factors.to(tensors[0].device).unbind())))


@dataclass(frozen=True)
class SizedStep:
    """What the optimizer is handed per layer, ``bases[i] * factors[i]`` (``factors`` None: the bases as they are),
    and the KL clip's ν for diagnostics (None: no clip)."""

    bases: list[torch.Tensor]
    factors: torch.Tensor | None
    nu: torch.Tensor | None

    def tensors(self) -> list[torch.Tensor]:
        """The step itself: every factor applied in one batched multiply."""
        return self.bases if self.factors is None else rescale(self.bases, self.factors)


def size_step(
    preconditioned: list[torch.Tensor], grads: list[torch.Tensor], *, grafting: Grafting, lr: float,
    kl_clip: float | None, loss_scale: float = 1.0, grad_norms: torch.Tensor | None = None,
) -> SizedStep:
    """The step's per-layer sizes under ``grafting`` and ``kl_clip``, times ``loss_scale`` (the optimizer divides the
    gradients it is handed by it). ``gradient``: K-FAC's direction at the raw gradient's norm, then the clip;
    ``kfac-size`` (an ablation): the raw gradient's direction at K-FAC's clipped size; ``none``: K-FAC's step and
    the clip (KAISA). ``grad_norms``: the FP32 norms of ``grads`` when the caller has them already."""
    if not preconditioned:
        return SizedStep(bases=[], factors=None, nu=None)
    factors = graft_ratios(preconditioned, grads, size_norms=grad_norms) if grafting is Grafting.GRADIENT else None
    nu = (kl_clip_scale(preconditioned, grads, lr=lr, kl_clip=kl_clip, weights=factors)
          if kl_clip is not None else None)
    bases = preconditioned
    if grafting is Grafting.KFAC_SIZE:  # the size is K-FAC's, clip included (ν below)
        bases, factors = grads, graft_ratios(grads, preconditioned, direction_norms=grad_norms)
    if nu is not None:
        factors = nu.float() * factors if factors is not None else nu.float().expand(len(bases))
    if loss_scale != 1.0:
        factors = (factors * loss_scale if factors is not None
                   else torch.full((len(bases),), loss_scale, device=bases[0].device))
    return SizedStep(bases=bases, factors=factors, nu=nu)
