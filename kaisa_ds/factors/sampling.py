"""Sampled factor statistics: A and G from a random subset of the rows (tokens) of each pass.

``E[x xᵀ]`` over all rows is estimated by the mean over ``k = ceil(fraction · n)`` rows drawn without
replacement, which is unbiased; counting ``k`` samples instead of ``n`` keeps the window mean exact in
expectation over passes of any size. The subset depends only on (step, pass, n), never on the rank or the
layer, so every rank and every layer of one pass use the same token positions, and a run is reproducible.
At fraction 1 nothing is drawn and the statistics are exactly the full ones.
"""

from __future__ import annotations

import math

import torch

_MIX = 1_000_003  # a prime, to fold (step, pass, n) into one generator seed


class RowSampler:
    """Draws and caches the row subset of each (step, pass, row count) on each device."""

    def __init__(self, *, fraction: float, seed: int = 0) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"factor_sample_fraction={fraction!r} is not valid; allowed: a number in (0, 1]")
        self.fraction = fraction
        self.seed = seed
        self._step = -1
        self._cache: dict[tuple[int, int, str], torch.Tensor] = {}

    @property
    def active(self) -> bool:
        return self.fraction < 1.0

    def indices(self, n: int, *, step: int, pass_index: int, device: torch.device) -> torch.Tensor | None:
        """Sorted row indices to keep of ``n`` rows, or None to keep all."""
        k = math.ceil(self.fraction * n)
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

    def rows(self, x: torch.Tensor, *, step: int, pass_index: int) -> torch.Tensor:
        """The sampled rows of a (samples, features) matrix (``x`` itself at fraction 1)."""
        idx = self.indices(x.shape[0], step=step, pass_index=pass_index, device=x.device)
        return x if idx is None else x.index_select(0, idx)
