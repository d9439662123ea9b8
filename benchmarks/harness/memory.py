"""Memory readings of this process (or another): its peak so far, its resident set, a resettable peak."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import torch

MB = 2**20


def peak_bytes(device: torch.device) -> int:
    """The process's peak memory so far: GPU allocations on CUDA, resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def peak_source(device: torch.device) -> str:
    """What :func:`peak_bytes` reads on ``device``, recorded beside the figures."""
    return "cuda.max_memory_allocated" if device.type == "cuda" else "ru_maxrss"


def rss_bytes() -> int:
    """This process's resident set size now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Make the kernel's peak RSS (VmHWM) start again from the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes(pid: int | str = "self") -> int:
    """VmHWM: the peak resident memory of one process (this one by default) since it started or since
    :func:`reset_peak_rss`, in bytes."""
    status = Path(f"/proc/{pid}/status")
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{status} has no VmHWM line: peak resident memory needs Linux's /proc")
