"""One Kronecker factor: a per-window accumulator plus a running average in its storage dtype."""

from __future__ import annotations

import weakref

import torch

from kaisa_ds.factors.symmetric import unpack_symmetric
from kaisa_ds.factors.window import HALF, ExactWindow, ScaledWindow


class KroneckerFactor:
    """A (or G) factor of one or more layers.

    Each forward/backward pass of an update window adds ``(Σ x xᵀ, n)`` to one buffer, so memory does not
    grow with the number of accumulation passes: FP32 for FP32/FP64 storage, and for FP16/BF16 storage the
    upper triangle in the storage dtype, scaled by a power of two (:mod:`kaisa_ds.factors.window`).
    :meth:`window_payload` gives the window's ``E[x xᵀ]`` over all its samples (times ``passes²`` for
    gradients of a loss averaged over passes) as ``(tensor, scale)``: ``tensor · scale`` is the mean.
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
        self._window = self._new_window()
        self._last_input: weakref.ref[torch.Tensor] | None = None
        self._pass_id: int | None = None  # the forward pass the open window's last call belonged to
        self.calls_in_pass = 0  # calls added to the open window's last pass

    def already_counted(self, inp: torch.Tensor) -> bool:
        """True when this very tensor was the last one added (a shared A factor's second reader)."""
        return self._last_input is not None and self._last_input() is inp

    def mark_counted(self, inp: torch.Tensor) -> None:
        self._last_input = weakref.ref(inp)

    def _new_window(self) -> ExactWindow | ScaledWindow:
        if self.storage_dtype in HALF:
            return ScaledWindow(self.storage_dtype, diagonal=self.diagonal)  # type: ignore[arg-type]
        return ExactWindow()

    @property
    def passes(self) -> int:
        """Forward (A) or backward (G) passes added to the open window so far."""
        return self._window.passes

    @property
    def window_rows(self) -> int:
        """Statistic rows (samples or tokens) added to the open window so far, over its passes."""
        return self._window.count

    @property
    def has_window(self) -> bool:
        return self._window.sum is not None

    @property
    def window_packed(self) -> bool:
        """Whether :meth:`window_payload` is the upper triangle (half-precision windows of square factors)."""
        return self._window.packed

    def _same_pass(self, pass_id: int | None) -> bool:
        return pass_id is not None and pass_id == self._pass_id and self._window.passes > 0

    def pass_index(self, pass_id: int | None) -> int:
        """The index in the open window of the pass a call of forward pass ``pass_id`` belongs to (None: a new
        pass)."""
        return self._window.passes - 1 if self._same_pass(pass_id) else self._window.passes

    def add(self, stat_sum: torch.Tensor, count: int, *, pass_id: int | None = None) -> None:
        """Add one call's statistic sum (FP32, consumed) over ``count`` samples to the window. Calls of one forward
        pass (``pass_id``; None: every call is a pass) add their rows to one pass."""
        same = self._same_pass(pass_id)
        self._window.add(stat_sum, count, new_pass=not same)
        self._pass_id, self.calls_in_pass = pass_id, self.calls_in_pass + 1 if same else 1

    def skip_pass(self, *, pass_id: int | None = None) -> None:
        """Count a pass of the window without its statistics (the pass sampler left it out)."""
        same = self._same_pass(pass_id)
        if not same:
            self._window.skip()
        self._pass_id, self.calls_in_pass = pass_id, self.calls_in_pass + 1 if same else 1

    def window_payload(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The window's ``E[x xᵀ]`` as ``(tensor, scale)`` (scale None: FP32 and already the mean; else the
        packed half-precision sum and its FP32 factor); None when nothing was captured."""
        return self._window.payload(self.scale_by_passes)

    def window_mean(self) -> torch.Tensor | None:
        """The window's ``E[x xᵀ]`` as a full FP32 matrix (None when nothing was captured)."""
        got = self.window_payload()
        return None if got is None else self.expand(*got)

    def expand(self, tensor: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """A (reduced) window payload as the full FP32 matrix (a vector for diagonal factors)."""
        if scale is None:
            return tensor
        full = unpack_symmetric(tensor, self.dim) if self.window_packed else tensor
        return full.float().mul_(scale)

    def discard(self) -> None:
        """Drop the current window's statistics."""
        self._window = self._new_window()
        self._pass_id, self.calls_in_pass = None, 0

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

    def commit(self, new: torch.Tensor, decay: float, scale: torch.Tensor | None = None) -> None:
        """Fold a (reduced) window statistic into the running average and clear the window; a ``scale``
        means ``new`` is a half-precision payload of :meth:`window_payload`'s form."""
        if scale is not None:
            new = self.expand(new, scale)
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
        return stored + self._window.nbytes()
