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

    Half-precision storage keeps the average divided by a power-of-two scale (held as an FP32 scalar
    tensor, so no host sync): G factors of real models have entries of 1e-12..1e-6, below FP16's
    smallest normal number, and would otherwise be stored as zeros. Stored values are at most 1 in
    magnitude, so FP16 keeps 11 significant bits relative to the largest entry and BF16 8.
    """

    def __init__(self, name: str, dim: int, *, diagonal: bool, storage_dtype: torch.dtype | None,
                 scale_by_passes: bool) -> None:
        self.name = name
        self.dim = dim
        self.diagonal = diagonal
        self.storage_dtype = storage_dtype
        self.scale_by_passes = scale_by_passes
        self._stored: torch.Tensor | None = None  # running average, divided by _scale when half precision
        self._scale: torch.Tensor | None = None  # FP32 scalar; None when stored unscaled
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
    def passes(self) -> int:
        """Forward (A) or backward (G) passes added to the open window so far."""
        return self._passes

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

    @property
    def has_value(self) -> bool:
        return self._stored is not None

    @property
    def value(self) -> torch.Tensor | None:
        """The running average at its true scale (FP32 when stored in half precision with a scale)."""
        if self._stored is None or self._scale is None:
            return self._stored
        return self._stored.float().mul_(self._scale)

    @value.setter
    def value(self, average: torch.Tensor | None) -> None:
        """Store ``average`` in the storage dtype (scaled into range for half precision)."""
        if average is None:
            self._stored, self._scale = None, None
            return
        dtype = self.storage_dtype or average.dtype
        if dtype not in (torch.float16, torch.bfloat16):
            self._stored, self._scale = average.to(dtype).clone(), None
            return
        full = average.float()
        peak = full.abs().amax().clamp_min(torch.finfo(torch.float32).tiny)
        scale = torch.exp2(torch.ceil(torch.log2(peak)))  # power of two: exact to divide and multiply back
        self._stored, self._scale = full.div_(scale).to(dtype), scale

    def commit(self, new: torch.Tensor, decay: float) -> None:
        """Fold a (reduced) window statistic into the running average and clear the window."""
        current = self._stored
        if current is None:
            self.value = new
        elif self._scale is None and current.dtype == torch.float32 and new.dtype == torch.float32:
            current.mul_(decay).add_(new, alpha=1.0 - decay)
        else:  # average in FP32, store in the (possibly half) storage dtype
            average = self.value
            assert average is not None
            self.value = average.float().mul_(decay).add_(new, alpha=1.0 - decay)
        self.updates += 1
        self.discard()

    def export(self) -> dict[str, torch.Tensor | int | None]:
        """The stored average (as stored: half precision stays half), its scale and update count, on CPU."""
        cpu = None if self._stored is None else self._stored.detach().cpu().clone()
        scale = None if self._scale is None else self._scale.detach().cpu().clone()
        return {"value": cpu, "scale": scale, "updates": self.updates}

    def restore(self, saved: dict[str, object], device: torch.device) -> None:
        """Load :meth:`export`'s output (or an older state without ``scale``) onto ``device``."""
        value, scale = saved.get("value"), saved.get("scale")
        if not isinstance(value, torch.Tensor):
            return
        full = value.to(device=device, dtype=torch.float32 if isinstance(scale, torch.Tensor) else value.dtype)
        self.value = full * scale.to(device) if isinstance(scale, torch.Tensor) else full
        self.updates = int(saved.get("updates", 0))  # type: ignore[call-overload]

    def dense(self) -> torch.Tensor | None:
        """The running average as a full matrix (diagonal factors expanded; for inspection and tests)."""
        value = self.value
        if value is None:
            return None
        return torch.diag(value) if self.diagonal else value

    def nbytes(self) -> int:
        stored = self._stored.numel() * self._stored.element_size() if self._stored is not None else 0
        window = self._sum.numel() * self._sum.element_size() if self._sum is not None else 0
        return stored + window
