"""The gradient noise scale ``B_simple = tr(Σ) / |G|²`` (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training", appendix A), the batch size past which a larger batch stops buying proportionally fewer steps.

Two gradient norms at two batch sizes give unbiased estimates of both terms: ``|g_b|²`` of one backward pass over
``b`` samples (a micro-batch on one rank) and ``|G_B|²`` of the step's gradient over ``B = b · passes · ranks``::

    |G|²  ≈ (B |G_B|² − b |g_b|²) / (B − b)        tr(Σ) ≈ (|g_b|² − |G_B|²) / (1/b − 1/B)

Gradient accumulation and data parallelism give both at no extra backward: a hook on each parameter adds the squared
norm of every pass's gradient before it is accumulated (one reduction per parameter and pass, on measured steps only),
and the step's gradient norms are those K-FAC's check computes anyway. Each term is smoothed by an exponential
moving average before the ratio is taken (their ratio is noisy, each term is not). It needs ``B > b``: more than
one accumulation pass or more than one rank.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

MEASURE_EVERY = 10  # steps between measurements (one reduction per parameter and pass on a measured step)


class NoiseScale:
    """Measures ``B_simple`` over the parameters ``params`` (K-FAC's layers: most of a transformer's weights)."""

    def __init__(self, params: Iterable[nn.Parameter], *, smoothing: float = 0.9) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.smoothing = smoothing
        self._pass_sq: torch.Tensor | None = None  # Σ |g_pass|² over the passes of the open step
        self._handles: list[RemovableHandle] = []
        self.measuring = False
        self.grad_sq: torch.Tensor | None = None  # EMA of |G|²
        self.trace: torch.Tensor | None = None  # EMA of tr(Σ)
        self.last: dict[str, float] = {}  # the last measurement's batch sizes (samples per pass, per step)

    def start(self) -> None:
        """Measure the next step: hook every parameter's per-pass gradient."""
        if self.measuring:
            return
        self.measuring, self._pass_sq = True, None
        self._handles = [p.register_hook(self._add) for p in self.params]

    def _add(self, grad: torch.Tensor) -> None:
        sq = grad.detach().float().pow(2).sum()
        self._pass_sq = sq if self._pass_sq is None else self._pass_sq + sq

    def update(self, step_grad_sq: torch.Tensor, *, samples_per_pass: int, passes: int, world: int,
               grad_scale: float = 1.0) -> None:
        """Fold one measured step in. ``step_grad_sq``: ``|G_B|²`` of the step's averaged gradient (unscaled);
        ``grad_scale``: what the per-pass gradients are multiplied by (the accumulation's ``1 / passes`` and a loss
        scale), undone here. Stops measuring; a collective under torch.distributed (a scalar all-reduce)."""
        for handle in self._handles:
            handle.remove()
        self._handles, self.measuring = [], False
        if self._pass_sq is None or passes < 1:
            return
        small = self._pass_sq / (passes * grad_scale**2)  # mean |g_b|² over this rank's passes
        if world > 1:
            torch.distributed.all_reduce(small)
            small = small / world
        b, big_b = float(samples_per_pass), float(samples_per_pass * passes * world)
        if big_b <= b:
            return  # one pass on one rank: two batch sizes are needed
        grad_sq = (big_b * step_grad_sq - b * small) / (big_b - b)
        trace = (small - step_grad_sq) / (1.0 / b - 1.0 / big_b)
        finite = torch.isfinite(grad_sq) & torch.isfinite(trace)  # an fp16 overflow step is left out (no sync)
        self.grad_sq, self.trace = (self._smoothed(old, new, finite=finite)
                                    for old, new in ((self.grad_sq, grad_sq), (self.trace, trace)))
        self.last = {"samples_per_pass": b, "samples_per_step": big_b}

    def _smoothed(self, old: torch.Tensor | None, new: torch.Tensor, *, finite: torch.Tensor) -> torch.Tensor:
        """The moving average with ``new`` folded in where the step's terms are finite (NaN until one is)."""
        if old is None:
            return torch.where(finite, new, torch.full_like(new, float("nan")))
        w = self.smoothing
        mixed = torch.where(torch.isfinite(old), w * old + (1 - w) * new, new)
        return torch.where(finite, mixed, old)

    def b_simple(self) -> float | None:
        """The smoothed estimate, in samples (sequences for a transformer's micro-batches); None before two measured
        steps' worth of a positive ``|G|²`` (one host sync)."""
        if self.grad_sq is None or self.trace is None:
            return None
        g2 = float(self.grad_sq)
        return float(self.trace) / g2 if g2 > 0 else None  # NaN (no finite step yet) compares False
