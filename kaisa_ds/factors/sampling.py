"""Sampled factor statistics: A and G from a random subset of the rows (tokens) of each pass
(:class:`RowSampler`), or from a random subset of the backward passes of each accumulation window
(:class:`PassSampler`).

``E[x xᵀ]`` over all rows is estimated by the mean over ``k = ceil(fraction · n)`` rows drawn without
replacement, which is unbiased; counting ``k`` samples instead of ``n`` keeps the window mean exact in
expectation over passes of any size. The subset depends only on (step, pass, n), never on the rank or the
layer, so every rank and every layer of one pass use the same token positions, and a run is reproducible.
At fraction 1 nothing is drawn and the statistics are exactly the full ones.

Pass subsets: of the ``P`` passes of a window, ``m = ceil(fraction · P)`` drawn without replacement feed the
factors; the others only count as passes. Every pass is equally likely to be drawn, so the mean over the drawn
passes' samples is an unbiased estimate of the window's mean (exactly so for passes of equal size), and the
``passes²`` rescaling of G (gradients of a loss averaged over the window's passes) still uses all ``P`` passes.
The subset depends only on the step, so every rank and every layer skip the same passes. A skipped pass costs
the hooks' bookkeeping only, which is what makes it cheaper than row sampling when many passes are accumulated.
"""

from __future__ import annotations

import math

import torch

from kaisa_ds.factors.statistics import Rows, keep_all

_MIX = 1_000_003  # a prime, to fold (step, pass, n) into one generator seed


class RowSampler:
    """Draws and caches the row subset of each (step, pass, row count) on each device."""

    def __init__(self, *, fraction: float, seed: int = 0) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"factor_sample_fraction={fraction!r} is not valid; allowed: a number in (0, 1]")
        self.fraction = self.configured = fraction
        self.seed = seed
        self._step = -1
        self._cache: dict[tuple[int, int, str], torch.Tensor] = {}

    def cap(self, *, rows_taken: int, max_rows: int | None) -> None:
        """Sample so that a factor update takes in at most ``max_rows`` rows, given the ``rows_taken`` of one
        (at the configured fraction); None: the configured fraction."""
        self.fraction = capped_fraction(self.configured, rows_taken=rows_taken, max_rows=max_rows)
        self._step, self._cache = -1, {}

    @property
    def active(self) -> bool:
        return self.fraction < 1.0

    def indices(self, n: int, *, step: int, pass_index: int, device: torch.device) -> torch.Tensor | None:
        """Sorted row indices to keep of ``n`` rows, or None to keep all."""
        k = kept_rows(self.fraction, n)
        if not self.active or k >= n:
            return None
        if step != self._step:
            self._step, self._cache = step, {}
        key = (pass_index, n, str(device))
        if key not in self._cache:
            seed = ((self.seed * _MIX + step) * _MIX + pass_index) * _MIX + n
            g = torch.Generator().manual_seed(seed % (2**63))
            self._cache[key] = torch.randperm(n, generator=g)[:k].sort().values.to(device, non_blocking=True)
        return self._cache[key]

    def selector(self, *, step: int, pass_index: int) -> Rows:
        """What picks the rows of one pass that feed a factor: all of them, or this sampler's subset."""
        if not self.active:
            return keep_all
        return lambda rows: self.rows(rows, step=step, pass_index=pass_index)

    def rows(self, x: torch.Tensor, *, step: int, pass_index: int) -> torch.Tensor:
        """The sampled rows of a (samples, features) matrix (``x`` itself at fraction 1)."""
        idx = self.indices(x.shape[0], step=step, pass_index=pass_index, device=x.device)
        return x if idx is None else x.index_select(0, idx)


def capped_fraction(fraction: float, *, rows_taken: float, max_rows: int | None) -> float:
    """The sample fraction under ``max_statistic_rows``: ``rows_taken`` rows per factor update at ``fraction``
    become at most ``max_rows`` (None: no cap)."""
    return fraction if max_rows is None else min(fraction, max_rows / (rows_taken / fraction))


def kept_rows(fraction: float, rows: int) -> int:
    """How many of a pass's ``rows`` feed the factors at ``factor_sample_fraction``."""
    return math.ceil(fraction * rows)


def kept_passes(fraction: float, passes: int) -> int:
    """How many of a window's ``passes`` feed the factors at ``factor_pass_fraction`` (at least one)."""
    return max(1, math.ceil(fraction * passes))


class PassSampler:
    """Which backward passes of an accumulation window of ``passes`` feed the factors (a new draw each step)."""

    def __init__(self, *, fraction: float, passes: int | None, seed: int = 0) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"factor_pass_fraction={fraction!r} is not valid; allowed: a number in (0, 1]")
        if fraction < 1.0 and passes is None:
            raise ValueError(f"factor_pass_fraction={fraction!r} needs accumulation_steps (the backward passes per "
                             "step; kaisa_ds.initialize takes it from gradient_accumulation_steps): set it, or set "
                             "factor_pass_fraction to 1")
        self.fraction = fraction
        self.passes = passes or 1
        self.keep = kept_passes(fraction, self.passes)
        self.seed = seed
        self._step = -1
        self._chosen: frozenset[int] = frozenset()

    @property
    def active(self) -> bool:
        return self.keep < self.passes

    def chosen(self, step: int) -> frozenset[int]:
        """The pass indices (0-based within the window) whose statistics are used at ``step``."""
        if not self.active:
            return frozenset(range(self.passes))
        if step != self._step:
            g = torch.Generator().manual_seed(((self.seed * _MIX + step) * _MIX + 7) % (2**63))
            self._step = step
            self._chosen = frozenset(torch.randperm(self.passes, generator=g)[:self.keep].tolist())
        return self._chosen

    def keeps(self, *, step: int, pass_index: int) -> bool:
        """Whether the ``pass_index``-th pass of the window at ``step`` feeds the factors (passes beyond the
        window's count wrap around, so a miscounted window still samples every pass)."""
        return not self.active or pass_index % self.passes in self.chosen(step)
