"""Symmetric matrices as their upper triangle (with diagonal): half the bytes to hold or to send."""

from __future__ import annotations

import torch

_TRIU_CACHE: dict[tuple[int, str], torch.Tensor] = {}


def _triu_index(n: int, device: torch.device) -> torch.Tensor:
    key = (n, str(device))
    if key not in _TRIU_CACHE:
        r, c = torch.triu_indices(n, n, device=device)
        _TRIU_CACHE[key] = r * n + c
    return _TRIU_CACHE[key]


def packed_size(n: int) -> int:
    return n * (n + 1) // 2


def pack_symmetric(t: torch.Tensor) -> torch.Tensor:
    """The upper triangle (with diagonal) of a square matrix as a vector."""
    return t.reshape(-1).index_select(0, _triu_index(t.shape[0], t.device))


def unpack_symmetric(vec: torch.Tensor, n: int) -> torch.Tensor:
    """Rebuild the full symmetric matrix from :func:`pack_symmetric`'s vector."""
    out = vec.new_zeros(n * n)
    out.index_copy_(0, _triu_index(n, vec.device), vec)
    m = out.view(n, n)
    return m + m.triu(1).t()
