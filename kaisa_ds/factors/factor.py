"""One Kronecker factor: a per-window FP32 accumulator plus a running average in its storage dtype."""

from __future__ import annotations

import weakref

import torch


class KroneckerFactor:
    """A (or G) factor of one or more layers.

    Each forward/backward pass of an update window adds ``(Σ x xᵀ, n)`` to one FP32 buffer, so memory
    does not grow with the number of accumulation passes. :meth:`window_mean` turns the window into
    ``E[x xᵀ]`` over all its samples (times ``passes²`` for gradients of a loss averaged over passes).
    :meth:`commit` folds it into the running average ``F ← ξ F + (1 − ξ) F_new``; the average is
    initialised with the first committed window (no identity or zero prior).
    """

    def __init__(self, name: str, dim: int, *, diagonal: bool, storage_dtype: torch.dtype | None,
                 scale_by_passes: bool) -> None:
        self.name = name
        self.dim = dim
        self.diagonal = diagonal
        self.storage_dtype = storage_dtype
        self.scale_by_passes = scale_by_passes
        self.value: torch.Tensor | None = None  # running average
        self.updates = 0
        self._sum: torch.Tensor | None = None
        self._count = 0
        self._passes = 0
        self._last_input: weakref.ref[torch.Tensor] | None = None

    def already_counted(self, inp: torch.Tensor) -> bool:
        """True when this very tensor was the last one added (a shared A factor's second reader)."""
        return self._last_input is not None and self._last_input() is inp

    def mark_counted(self, inp: torch.Tensor) -> None:
        self._last_input = weakref.ref(inp)

    @property
    def has_window(self) -> bool:
        return self._sum is not None

    def add(self, stat_sum: torch.Tensor, count: int) -> None:
        """Add one pass's statistic sum (FP32) over ``count`` samples to the window."""
        if self._sum is None:
            self._sum = stat_sum.clone() if stat_sum.dtype == torch.float32 else stat_sum.float()
        else:
            self._sum.add_(stat_sum)
        self._count += count
        self._passes += 1

    def window_mean(self) -> torch.Tensor | None:
        """The window's ``E[x xᵀ]`` in FP32 (None when nothing was captured)."""
        if self._sum is None or self._count == 0:
            return None
        scale = (self._passes**2 if self.scale_by_passes else 1) / self._count
        return self._sum.mul_(scale)

    def discard(self) -> None:
        """Drop the current window's statistics."""
        self._sum, self._count, self._passes = None, 0, 0

    def commit(self, new: torch.Tensor, decay: float) -> None:
        """Fold a (reduced) window statistic into the running average and clear the window."""
        dtype = self.storage_dtype or new.dtype
        if self.value is None:
            self.value = new.to(dtype).clone()
        elif self.value.dtype == torch.float32 and dtype == torch.float32:
            self.value.mul_(decay).add_(new, alpha=1.0 - decay)
        else:  # average in FP32, store in the (possibly half) storage dtype
            self.value.copy_(self.value.float().mul_(decay).add_(new, alpha=1.0 - decay))
        self.updates += 1
        self.discard()

    def dense(self) -> torch.Tensor | None:
        """The running average as a full matrix (diagonal factors expanded; for inspection and tests)."""
        if self.value is None:
            return None
        return torch.diag(self.value) if self.diagonal else self.value

    def nbytes(self) -> int:
        stored = self.value.numel() * self.value.element_size() if self.value is not None else 0
        window = self._sum.numel() * self._sum.element_size() if self._sum is not None else 0
        return stored + window
