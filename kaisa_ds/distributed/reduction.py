"""Factor-window reduction across ranks, in buckets that can start during the backward pass.

A factor window ends with the last accumulation pass before ``step()``. With ``overlap_factor_reduction`` the
layers are bucketed in reverse registration order (the order their output gradients arrive in), up to
``allreduce_bucket_cap_mb`` of payload per bucket; on the window's last backward pass each bucket's all-reduce
starts (``async_op=True``) from the output-gradient hook that completes it, and ``step()`` only waits on the
handles (and starts any bucket that did not complete, e.g. a layer that did not run). Overlap needs
``accumulation_steps`` (``kaisa_ds.initialize`` sets it from the engine); without it (plain PyTorch, by default)
the windows are reduced inside ``step()``, as before. Buckets start strictly
in order, so every rank issues the same collectives in the same order; they run on a process group of their
own, so they never interleave with the engine's gradient all-reduces on the default group. Without overlap
(or before the structure is known) everything is reduced inside ``step()``, FP32 exactly as before.

What travels: FP32 windows as the FP32 mean (upper triangles with ``symmetry_aware``); FP16/BF16 windows as
their packed upper triangle in the storage dtype with a common per-factor FP32 scale
(:func:`~kaisa_ds.distributed.collectives.start_scaled_allreduce`). A statistic that arrives after its bucket
started (more backward passes than ``accumulation_steps``, or a layer run twice in one pass) raises: the value
in flight would silently miss it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kaisa_ds.config import KFACConfig
from kaisa_ds.distributed.collectives import PendingMean, PendingScaled, start_allreduce_mean, start_scaled_allreduce
from kaisa_ds.factors.factor import KroneckerFactor
from kaisa_ds.factors.symmetric import packed_size

Reduced = dict[str, tuple[torch.Tensor, torch.Tensor | None]]  # factor -> (payload, scale or None)


@dataclass
class _Bucket:
    factors: list[KroneckerFactor]
    layers: set[str]
    done: set[str] = field(default_factory=set)


def _payload_bytes(f: KroneckerFactor, config: KFACConfig) -> int:
    half = f.storage_dtype in (torch.float16, torch.bfloat16)
    if f.diagonal:
        return f.dim * (2 if half else 4)
    packed = half or config.symmetry_aware
    return (packed_size(f.dim) if packed else f.dim * f.dim) * (2 if half else 4)


def reverse_buckets(layers: dict[str, tuple[KroneckerFactor, KroneckerFactor]], config: KFACConfig) -> list[_Bucket]:
    """Layers in reverse registration order, cut into buckets of at most the cap (a bigger factor alone);
    a factor shared by several layers goes with the first of them in that order."""
    cap = config.allreduce_bucket_cap_mb * 2**20
    buckets: list[_Bucket] = []
    seen: set[str] = set()
    size = 0.0
    for name, (a, g) in reversed(list(layers.items())):
        new = [f for f in (g, a) if f.name not in seen]
        nbytes = sum(_payload_bytes(f, config) for f in new)
        if not buckets or (buckets[-1].factors and size + nbytes > cap):
            buckets.append(_Bucket([], set()))
            size = 0.0
        buckets[-1].factors += new
        buckets[-1].layers.add(name)
        seen.update(f.name for f in new)
        size += nbytes
    return buckets


class WindowReducer:
    """Starts and finishes the reduction of one factor window; one per structure."""

    def __init__(self, layers: dict[str, tuple[KroneckerFactor, KroneckerFactor]], *, config: KFACConfig,
                 world: int, group: dist.ProcessGroup | None, calls: dict[str, int] | None = None) -> None:
        self.config = config
        self.calls = calls if calls is not None else {}  # calls per pass (live): a G is complete after that many
        self.world = world
        self.group = group
        # overlap needs to know which backward pass is a window's last: the engine says (gradient accumulation),
        # a plain-PyTorch user opts in with accumulation_steps; unknown, the window is reduced inside step()
        self.overlap = config.overlap_factor_reduction and world > 1 and config.accumulation_steps is not None
        self.buckets = reverse_buckets(layers, config)
        self._bucket_of = {name: i for i, b in enumerate(self.buckets) for name in b.layers}
        self._next = 0  # the first bucket not started yet
        self._flights: list[tuple[list[KroneckerFactor], list[bool], PendingMean | PendingScaled]] = []
        self._started: set[str] = set()
        self.launch_seconds = 0.0  # time spent starting buckets inside the hooks since the last step

    @property
    def started(self) -> int:
        """Buckets (or whole-window reductions) started and not yet waited on."""
        return len(self._flights)

    def check_open(self, factor: KroneckerFactor) -> None:
        """Raise when ``factor``'s window was already sent (a statistic would be lost)."""
        if factor.name in self._started:
            raise RuntimeError(
                f"K-FAC: a statistic of {factor.name} arrived after its factor reduction started: the window had "
                f"{self.config.accumulation_steps} backward pass(es) already (accumulation_steps), or the layer "
                "runs twice in one pass. Set accumulation_steps to the backward passes per step, or "
                "overlap_factor_reduction=False")

    def grad_complete(self, layer: str, factor: KroneckerFactor) -> None:
        """A layer's output-gradient statistic was added: start every bucket that is now complete, in order."""
        if not self.overlap or factor.passes < (self.config.accumulation_steps or 1):
            return
        if factor.calls_in_pass < self.calls.get(layer, 1):  # more calls of this pass are still to come
            return
        bucket = self._bucket_of.get(layer)
        if bucket is None or bucket < self._next:
            return
        self.buckets[bucket].done.add(layer)
        start = time.perf_counter()
        while self._next < len(self.buckets) and self.buckets[self._next].done >= self.buckets[self._next].layers:
            self._start(self.buckets[self._next].factors)
            self._next += 1
        self.launch_seconds += time.perf_counter() - start

    def _start(self, factors: list[KroneckerFactor]) -> None:
        payloads = [f.window_payload() for f in factors]
        local = [p is not None for p in payloads]
        if factors and factors[0].storage_dtype in (torch.float16, torch.bfloat16):
            self._flights.append((factors, local, self._start_scaled(factors, payloads)))
        else:
            self._flights.append((factors, local, self._start_mean(factors, payloads)))
        for f in factors:  # the payload is in flight (or a copy is): the window itself is no longer needed
            self._started.add(f.name)
            f.discard()

    def _start_mean(self, factors: list[KroneckerFactor],
                    payloads: list[tuple[torch.Tensor, torch.Tensor | None] | None]) -> PendingMean:
        device = next((p[0].device for p in payloads if p is not None), torch.device("cpu"))
        tensors = [p[0] if p is not None else torch.zeros(f.dim if f.diagonal else (f.dim, f.dim), device=device)
                   for f, p in zip(factors, payloads)]
        present = torch.tensor([float(p is not None) for p in payloads], device=device)
        symmetric = [self.config.symmetry_aware and not f.diagonal for f in factors] + [False]
        return start_allreduce_mean(tensors + [present], bucket_cap_mb=self.config.allreduce_bucket_cap_mb,
                                    symmetric=symmetric, group=self.group)

    def _start_scaled(self, factors: list[KroneckerFactor],
                      payloads: list[tuple[torch.Tensor, torch.Tensor | None] | None]) -> PendingScaled:
        device = next((p[0].device for p in payloads if p is not None), torch.device("cpu"))
        dtype = factors[0].storage_dtype
        tensors = [p[0] if p is not None else torch.zeros(
            f.dim if f.diagonal else packed_size(f.dim), dtype=dtype, device=device) for f, p in zip(factors, payloads)]
        zero = torch.zeros((), device=device)
        scales = torch.stack([p[1] if p is not None and p[1] is not None else zero for p in payloads])
        return start_scaled_allreduce(tensors, scales.float(), group=self.group)

    def finish(self, factors: dict[str, KroneckerFactor]) -> tuple[Reduced, int]:
        """Start what has not started, wait for everything; the reduced payloads of every factor some rank
        captured, and the bytes this rank sent."""
        if not self.overlap and not self._flights:
            if not any(f.has_window for f in factors.values()):
                return {}, 0
            self._start(list(factors.values()))  # one call in registration order, as before overlap existed
            self._next = len(self.buckets)
        while self._next < len(self.buckets):
            self._start(self.buckets[self._next].factors)
            self._next += 1
        reduced: Reduced = {}
        flags: list[torch.Tensor] = []
        names: list[str] = []
        sent = 0
        local: list[bool] = []
        for facs, here, pending in self._flights:
            sent += pending.sent
            local += here
            if isinstance(pending, PendingScaled):
                values, scales, present = pending.wait()
                reduced.update({f.name: (v, s) for f, v, s in zip(facs, values, scales.unbind(0))})
            else:
                results = pending.wait()
                if self.world > 1:
                    present = results[-1] * self.world
                    reduced.update({f.name: (r * (self.world / c.clamp(min=1)), None)
                                    for f, r, c in zip(facs, results[:-1], present)})
                else:
                    present = results[-1]
                    reduced.update({f.name: (r, None) for f, r in zip(facs, results[:-1])})
            flags.append(present)
            names += [f.name for f in facs]
        # ranks that captured a factor: from the reduced flags (one host sync), or known locally at world 1
        keep = torch.cat(flags).tolist() if self.world > 1 and flags else local
        self.reset()
        return {n: reduced[n] for n, k in zip(names, keep) if k > 0}, sent

    def reset(self) -> None:
        """Forget the window (after it was reduced, or dropped)."""
        self._next, self._flights, self._started = 0, [], set()
        for b in self.buckets:
            b.done = set()
