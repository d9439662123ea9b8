"""Bucketed collectives over ``torch.distributed``: factor all-reduce and grouped broadcasts.

Flattening uses NVIDIA Apex's ``apex_C`` kernels when importable, else PyTorch's. Symmetric factors
can travel as their upper triangle only (``symmetry_aware``), roughly halving factor traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from kaisa_ds.factors.symmetric import pack_symmetric, unpack_symmetric

try:  # NVIDIA Apex's C extension, only when it is really installed
    import apex_C  # type: ignore[import-not-found]

    flatten, unflatten = apex_C.flatten, apex_C.unflatten
    FLATTEN_IMPL = "apex_C"
except ImportError:  # pragma: no cover - depends on the environment
    flatten, unflatten = _flatten_dense_tensors, _unflatten_dense_tensors
    FLATTEN_IMPL = "torch"

__all__ = ["FLATTEN_IMPL", "PendingMean", "PendingScaled", "allreduce_mean", "broadcast_flat", "pack_symmetric",
           "rank", "start_allreduce_mean", "start_scaled_allreduce", "unpack_symmetric", "world_size"]

def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


CPU_BACKENDS = ("gloo", "mpi", "ccl")  # process-group backends of CPU ranks (DeepSpeed's CPU accelerator: gloo)


def cpu_ranks() -> bool:
    """Whether the default process group's ranks compute on CPUs (False when there is none)."""
    return world_size() > 1 and str(dist.get_backend()) in CPU_BACKENDS


def on_any_rank(flags: dict[str, bool], *, device: torch.device) -> set[str]:
    """The names flagged on at least one rank (one all-reduce; every rank passes the same names in the same order)."""
    if world_size() == 1:
        return {n for n, on in flags.items() if on}
    tensor = torch.tensor([float(on) for on in flags.values()], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return {n for n, on in zip(flags, tensor.tolist()) if on > 0}


def sum_over_ranks(value: int, *, device: torch.device) -> int:
    """``value`` summed over every rank (one all-reduce; every rank must call it)."""
    return _reduce_int(value, device=device, op=dist.ReduceOp.SUM)


def max_over_ranks(value: int, *, device: torch.device) -> int:
    """The largest ``value`` of every rank (one all-reduce; every rank must call it)."""
    return _reduce_int(value, device=device, op=dist.ReduceOp.MAX)


def _reduce_int(value: int, *, device: torch.device, op: dist.ReduceOp.RedOpType) -> int:
    if world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=op)
    return int(tensor.item())


def _buckets(tensors: Sequence[torch.Tensor], cap_bytes: int) -> list[list[int]]:
    buckets: list[list[int]] = [[]]
    size = 0
    for i, t in enumerate(tensors):
        nbytes = t.numel() * t.element_size()
        if buckets[-1] and size + nbytes > cap_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return [b for b in buckets if b]


@dataclass
class PendingMean:
    """All-reduces in flight (one per bucket); :meth:`wait` averages and unpacks them."""

    tensors: list[torch.Tensor]
    symmetric: Sequence[bool]
    packed: list[torch.Tensor]
    world: int
    sent: int
    flights: list[tuple[list[int], torch.Tensor, object]] = field(default_factory=list)

    def wait(self) -> list[torch.Tensor]:
        if self.world == 1:
            return self.tensors
        results: list[torch.Tensor | None] = [None] * len(self.tensors)
        for bucket, flat, work in self.flights:
            work.wait()  # type: ignore[attr-defined]
            flat.div_(self.world)
            for i, vec in zip(bucket, unflatten(flat, [self.packed[i] for i in bucket])):
                t = self.tensors[i]
                results[i] = unpack_symmetric(vec, t.shape[0]) if self.symmetric[i] else vec.view_as(t)
        return [r for r in results if r is not None]


def start_allreduce_mean(tensors: list[torch.Tensor], *, bucket_cap_mb: float, symmetric: Sequence[bool],
                         group: dist.ProcessGroup | None = None) -> PendingMean:
    """Start averaging tensors across ranks in flattened buckets (asynchronously); ``wait()`` for the results."""
    packed = [pack_symmetric(t) if sym else t.reshape(-1) for t, sym in zip(tensors, symmetric)]
    sent = sum(p.numel() * p.element_size() for p in packed)
    n = world_size()
    pending = PendingMean(tensors, symmetric, packed, n, sent if n > 1 else 0)
    if n > 1:
        for bucket in _buckets(packed, int(bucket_cap_mb * 2**20)):
            flat = flatten([packed[i] for i in bucket])
            pending.flights.append((bucket, flat, dist.all_reduce(flat, group=group, async_op=True)))
    return pending


def allreduce_mean(tensors: list[torch.Tensor], *, bucket_cap_mb: float, symmetric: Sequence[bool],
                   group: dist.ProcessGroup | None = None) -> tuple[list[torch.Tensor], int]:
    """Average tensors across ranks in flattened buckets; returns the results and bytes sent."""
    pending = start_allreduce_mean(tensors, bucket_cap_mb=bucket_cap_mb, symmetric=symmetric, group=group)
    return pending.wait(), pending.sent


@dataclass
class PendingScaled:
    """A half-precision all-reduce in flight; :meth:`wait` gives each payload (a view of the summed buffer)
    and its FP32 scale, already divided by the number of ranks that contributed."""

    values: list[torch.Tensor]  # views of the flat buffer being summed (the payloads themselves at world 1)
    scales: torch.Tensor  # common scale per payload (max over ranks), divided by the contributing ranks
    present: torch.Tensor  # contributing ranks per payload
    sent: int
    work: object | None

    def wait(self) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        if self.work is not None:
            self.work.wait()  # type: ignore[attr-defined]
        return self.values, self.scales, self.present


def start_scaled_allreduce(payloads: list[torch.Tensor], scales: torch.Tensor, *,
                           group: dist.ProcessGroup | None = None) -> PendingScaled:
    """Start summing half-precision payloads (``payload · scale`` is a rank's value; scale 0: no value).

    The ranks first agree on a common scale per payload, the largest of theirs (one all-gather of the FP32
    scales, which also counts the contributing ranks); each rank then sends ``payload · (own / common)``,
    rounded once to the payload dtype, so every entry sent is at most 1 in magnitude and the sum at most the
    world size: no overflow in FP16 up to 65504 ranks, no flush of small statistics to zero beyond what the
    payload dtype already loses. The sum travels in the payload dtype (flattened, one all-reduce), asynchronously.
    """
    sizes = [p.numel() for p in payloads]
    n = world_size()
    if n == 1:
        return PendingScaled(payloads, scales, (scales > 0).float(), 0, None)
    gathered = scales.new_empty(n * scales.numel())
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the newer name first
    gather(gathered, scales.contiguous(), group=group)
    gathered = gathered.view(n, -1)
    common = gathered.amax(0)
    present = (gathered > 0).sum(0).float()
    ratio = torch.where(common > 0, scales / common, torch.zeros_like(scales))
    dtype = payloads[0].dtype
    flat = torch.empty(sum(sizes), dtype=dtype, device=payloads[0].device)
    views = list(flat.split(sizes))
    torch._foreach_copy_(views, [p.reshape(-1) for p in payloads])
    torch._foreach_mul_(views, list(ratio.unbind(0)))
    work = dist.all_reduce(flat, group=group, async_op=True)
    sent = flat.numel() * flat.element_size() + gathered.numel() * gathered.element_size() // n
    return PendingScaled(views, common / present.clamp(min=1), present, sent, work)


def broadcast_flat(tensors: list[torch.Tensor], *, src: int, group: dist.ProcessGroup | None) -> list[torch.Tensor]:
    """Broadcast a list of tensors from ``src`` as one flat buffer; receivers pass correctly shaped
    placeholders and get the received tensors back."""
    if not tensors:
        return tensors
    flat = flatten(tensors)
    dist.broadcast(flat, src=src, group=group)
    return list(unflatten(flat, tensors))
