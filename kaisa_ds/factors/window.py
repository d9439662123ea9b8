"""The open accumulation window of one factor: exact FP32 sums, or scaled half-precision sums.

:class:`ExactWindow` (FP32/FP64 storage) adds each pass's ``Σ x xᵀ`` into one FP32 buffer, as it always did.

:class:`ScaledWindow` (FP16/BF16 storage) holds the window in the storage dtype, as the upper triangle only
(statistics are symmetric), divided by a power-of-two scale ``s`` kept as an FP32 scalar tensor (no host sync).
Numerics: ``s`` is the smallest power of two ≥ ``B = Σ_passes max|stat_pass|``, an upper bound of every entry of
the window sum, so stored entries stay in [-1, 1] at any number of passes and any magnitude (G statistics of
1e-12 do not underflow, sums of many large passes do not overflow FP16's 65504). When a pass raises ``B`` past
``s`` the buffer is multiplied by ``s_old / s_new``, a power of two, which is exact (bar entries falling below
FP16's normal range, 6e-5 of the window's bound, which the stored average loses anyway). Each pass then costs
one rounding of the sum to the storage dtype: after ``k`` passes an entry is off by at most ``k·u·B`` with
``u = 2⁻¹¹`` (FP16) or ``2⁻⁸`` (BF16), the same order as the ``u`` relative to the largest entry that the
stored running average has anyway, and a random-walk ``√k·u·B`` in practice. The alternative, folding each
pass into the running average directly, would need the window's sample count before its first pass and could
not drop a non-finite window; a separate scaled buffer costs one half-precision triangle per factor.
"""

from __future__ import annotations

import torch

from kaisa_ds.factors.symmetric import pack_symmetric

HALF = (torch.float16, torch.bfloat16)


def power_of_two_above(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two ≥ ``x`` (FP32 scalar tensor; tiny values clamp to FP32's smallest normal)."""
    return torch.exp2(torch.ceil(torch.log2(x.clamp_min(torch.finfo(torch.float32).tiny))))


class ExactWindow:
    """``(Σ x xᵀ, n)`` of every pass in one FP32 buffer (the buffer is the first pass's own tensor, cloned)."""

    packed = False

    def __init__(self) -> None:
        self.sum: torch.Tensor | None = None
        self.count = 0
        self.passes = 0

    def add(self, stat_sum: torch.Tensor, count: int, *, new_pass: bool = True) -> None:
        """Add one call's statistic; ``new_pass`` False: a further call of the same pass (its rows are samples)."""
        if self.sum is None:
            self.sum = stat_sum.clone() if stat_sum.dtype == torch.float32 else stat_sum.float()
        else:
            self.sum.add_(stat_sum)
        self.count += count
        self.passes += int(new_pass)

    def skip(self) -> None:
        """Count a pass whose statistics are not used (a pass subset): it still scales G by ``passes²``."""
        self.passes += 1

    def payload(self, passes_squared: bool) -> tuple[torch.Tensor, None] | None:
        """The window's ``E[x xᵀ]`` (computed in place) and no scale; None when nothing was captured."""
        if self.sum is None or self.count == 0:
            return None
        return self.sum.mul_((self.passes**2 if passes_squared else 1) / self.count), None

    def nbytes(self) -> int:
        return self.sum.numel() * self.sum.element_size() if self.sum is not None else 0


class ScaledWindow:
    """Half-precision window sums divided by a power-of-two scale; symmetric statistics kept packed."""

    def __init__(self, dtype: torch.dtype, *, diagonal: bool) -> None:
        self.dtype = dtype
        self.packed = not diagonal
        self.sum: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None  # power of two, FP32 scalar
        self.bound: torch.Tensor | None = None  # Σ max|stat| over the passes: bounds every entry of the sum
        self.count = 0
        self.passes = 0

    def add(self, stat_sum: torch.Tensor, count: int, *, new_pass: bool = True) -> None:
        """Add one call's statistic (FP32, consumed: it may be divided in place); ``new_pass`` False: a further call
        of the same pass."""
        vec = pack_symmetric(stat_sum) if self.packed else stat_sum.float()
        peak = vec.abs().amax().float()
        self.bound = peak if self.bound is None else self.bound + peak
        scale = power_of_two_above(self.bound)
        if self.sum is None or self.scale is None:
            self.sum = vec.div_(scale).to(self.dtype)
        else:
            self.sum.mul_(self.scale / scale).add_(vec.div_(scale))
        self.scale = scale
        self.count += count
        self.passes += int(new_pass)

    def skip(self) -> None:
        """Count a pass whose statistics are not used (a pass subset): it still scales G by ``passes²``."""
        self.passes += 1

    def payload(self, passes_squared: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The window sum as held (packed, half precision) and the FP32 factor that makes it ``E[x xᵀ]``."""
        if self.sum is None or self.scale is None or self.count == 0:
            return None
        return self.sum, self.scale * ((self.passes**2 if passes_squared else 1) / self.count)

    def nbytes(self) -> int:
        return self.sum.numel() * self.sum.element_size() if self.sum is not None else 0
