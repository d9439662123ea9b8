"""Symmetric packing and bucketed all-reduce."""

from __future__ import annotations

import torch
import torch.distributed as dist

from kaisa_ds.distributed.collectives import allreduce_mean, pack_symmetric, unpack_symmetric
from tests.support.launch import run_distributed


def test_symmetric_pack_round_trip_halves_payload() -> None:
    x = torch.randn(7, 7)
    s = x + x.t()
    packed = pack_symmetric(s)
    assert packed.numel() == 7 * 8 // 2
    torch.testing.assert_close(unpack_symmetric(packed, 7), s)


def _reduce(rank: int, world: int) -> tuple[list[torch.Tensor], int]:
    torch.manual_seed(rank)
    x = torch.randn(5, 5)
    tensors = [x + x.t(), torch.full((3,), float(rank)), torch.eye(4) * (rank + 1)]
    out, sent = allreduce_mean(tensors, bucket_cap_mb=1e-5, symmetric=[True, False, True])  # tiny cap: 3 buckets
    assert dist.get_world_size() == world
    return out, sent


def test_bucketed_allreduce_averages_across_ranks() -> None:
    results = run_distributed(_reduce, 2)
    expected = []
    for r in range(2):
        torch.manual_seed(r)
        x = torch.randn(5, 5)
        expected.append(x + x.t())
    for out, sent in results:
        torch.testing.assert_close(out[0], (expected[0] + expected[1]) / 2)
        torch.testing.assert_close(out[1], torch.full((3,), 0.5))
        torch.testing.assert_close(out[2], torch.eye(4) * 1.5)
        assert sent == (15 + 3 + 10) * 4
