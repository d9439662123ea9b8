"""The memory readings the benchmarks share: the resettable peak (VmHWM) follows the resident set, the lifetime
peak (ru_maxrss) holds the same allocation, and another process can be read by its pid."""

from __future__ import annotations

import os

import torch

from benchmarks.harness.memory import MB, peak_bytes, peak_rss_bytes, reset_peak_rss, rss_bytes


def test_peak_rss_resets_to_the_resident_set_and_rises_with_an_allocation() -> None:
    reset_peak_rss()
    start = rss_bytes()
    assert abs(peak_rss_bytes() - start) < 16 * MB
    block = torch.ones(64 * MB // 4)  # 64 MB, every page touched
    assert peak_rss_bytes() - start >= 48 * MB
    assert peak_bytes(torch.device("cpu")) >= start + 48 * MB  # the peak ru_maxrss reads holds it too
    del block


def test_peak_rss_of_a_process_by_its_pid() -> None:
    mine = peak_rss_bytes(os.getpid())
    assert mine > 0 and abs(mine - peak_rss_bytes()) < 16 * MB
