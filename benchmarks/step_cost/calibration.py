"""The rates ``python -m kaisa_ds.plan --calibration`` reads, measured here: seconds of one FP32 eigendecomposition
and damped inverse per factor size, and the GEMM rate of the factor statistics."""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.harness.timing import median, timed
from kaisa_ds.enums import DTYPES
from kaisa_ds.plan.bert_sizes import SIZES


def decomposition_times(sizes: list[int], device: torch.device, *, repeats: int) -> list[dict[str, Any]]:
    """Seconds of one FP32 ``eigh`` and one damped ``inv`` of an n x n SPD matrix (median of repeats)."""
    cuda = device.type == "cuda"
    rows = []
    for n in tqdm(sizes, desc="decompositions", leave=False):
        g = torch.Generator(device="cpu").manual_seed(n)
        x = torch.randn(2 * n, n, generator=g).to(device)
        factor = x.t() @ x / (2 * n)
        damped = factor + 1e-3 * torch.eye(n, device=device)
        torch.linalg.eigh(factor)  # untimed: the first call at a size pays for workspace and page faults
        torch.linalg.inv(damped)
        reps = repeats if n <= 2048 or cuda else 1
        eigh = median([timed(partial(torch.linalg.eigh, factor), cuda=cuda) for _ in range(reps)])
        inverse = median([timed(partial(torch.linalg.inv, damped), cuda=cuda) for _ in range(reps)])
        rows.append({"size": n, "repeats": reps, "eigh_fp32_s": eigh, "inverse_fp32_s": inverse})
    return rows


def gemm_gflops(device: torch.device, dtype: str, *, rows: int, n: int, repeats: int = 5) -> float:
    """GFLOP/s of the statistics' GEMM ``xᵀx`` (rows x n) in the run's dtype: the planner's GEMM rate."""
    cuda = device.type == "cuda"
    x = torch.randn(rows, n, device=device, dtype=DTYPES[dtype])
    x.t() @ x  # untimed: workspace
    seconds = median([timed(lambda: x.t() @ x, cuda=cuda) for _ in range(repeats)])
    return 2.0 * rows * n * n / seconds / 1e9


def calibration(res: dict[str, Any], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The rates ``python -m kaisa_ds.plan --calibration`` reads: GEMM GFLOP/s, eigh and inverse seconds per
    factor size, and the measured baseline step with the settings it belongs to."""
    hidden = SIZES[args.size][0]
    return {"gemm_gflops": gemm_gflops(device, args.dtype, rows=args.batch * args.seq, n=hidden),
            "eigh_seconds": {str(d["size"]): d["eigh_fp32_s"] for d in res["decompositions"]},
            "inverse_seconds": {str(d["size"]): d["inverse_fp32_s"] for d in res["decompositions"]},
            "baseline_step_s": res["baseline"]["step_s"], "passes": args.accumulation,
            "settings": {"model": args.size, "micro_batch": args.batch, "seq": args.seq},
            "device": str(device), "dtype": args.dtype}
