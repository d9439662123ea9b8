"""Bucketed collectives over ``torch.distributed``: factor all-reduce and grouped broadcasts.

Flattening uses NVIDIA Apex's ``apex_C`` kernels when importable, else PyTorch's. Symmetric factors
can travel as their upper triangle only (``symmetry_aware``), roughly halving factor traffic.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

try:  # NVIDIA Apex's C extension, only when it is really installed
    import apex_C  # type: ignore[import-not-found]

    flatten, unflatten = apex_C.flatten, apex_C.unflatten
    FLATTEN_IMPL = "apex_C"
except ImportError:  # pragma: no cover - depends on the environment
    flatten, unflatten = _flatten_dense_tensors, _unflatten_dense_tensors
    FLATTEN_IMPL = "torch"

_TRIU_CACHE: dict[tuple[int, str], torch.Tensor] = {}


def _triu_index(n: int, device: torch.device) -> torch.Tensor:
    key = (n, str(device))
    if key not in _TRIU_CACHE:
        r, c = torch.triu_indices(n, n, device=device)
        _TRIU_CACHE[key] = r * n + c
    return _TRIU_CACHE[key]


def pack_symmetric(t: torch.Tensor) -> torch.Tensor:
    """The upper triangle (with diagonal) of a square matrix as a vector."""
    return t.reshape(-1).index_select(0, _triu_index(t.shape[0], t.device))


def unpack_symmetric(vec: torch.Tensor, n: int) -> torch.Tensor:
    """Rebuild the full symmetric matrix from :func:`pack_symmetric`'s vector."""
    out = vec.new_zeros(n * n)
    out.index_copy_(0, _triu_index(n, vec.device), vec)
    m = out.view(n, n)
    return m + m.triu(1).t()


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


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


def allreduce_mean(tensors: list[torch.Tensor], *, bucket_cap_mb: float, symmetric: Sequence[bool],
                   group: dist.ProcessGroup | None = None) -> tuple[list[torch.Tensor], int]:
    """Average tensors across ranks in flattened buckets; returns the results and bytes sent."""
    packed = [pack_symmetric(t) if sym else t.reshape(-1) for t, sym in zip(tensors, symmetric)]
    sent = sum(p.numel() * p.element_size() for p in packed)
    n = world_size()
    if n == 1:
        return tensors, 0
    results: list[torch.Tensor | None] = [None] * len(tensors)
    pending = []
    for bucket in _buckets(packed, int(bucket_cap_mb * 2**20)):
        flat = flatten([packed[i] for i in bucket])
        pending.append((bucket, flat, dist.all_reduce(flat, group=group, async_op=True)))
    for bucket, flat, work in pending:
        work.wait()
        flat.div_(n)
        for i, vec in zip(bucket, unflatten(flat, [packed[i] for i in bucket])):
            t = tensors[i]
            results[i] = unpack_symmetric(vec, t.shape[0]) if symmetric[i] else vec.view_as(t)
    return [r for r in results if r is not None], sent


def broadcast_flat(tensors: list[torch.Tensor], *, src: int, group: dist.ProcessGroup | None) -> list[torch.Tensor]:
    """Broadcast a list of tensors from ``src`` as one flat buffer; receivers pass correctly shaped
    placeholders and get the received tensors back."""
    if not tensors:
        return tensors
    flat = flatten(tensors)
    dist.broadcast(flat, src=src, group=group)
    return list(unflatten(flat, tensors))
