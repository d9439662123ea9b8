"""Part ``eigh``: FP32 eigendecompositions of 1024² and 4096² factors (BERT-Large's hidden and intermediate sizes).

Per size, ``count`` random SPD matrices decomposed: one at a time; in one batched call (PyTorch's batched eigh runs a
per-matrix loop above n=32 on CUDA); one at a time each on its own CUDA stream; through kaisa_ds's own
``decompose_all`` (what K-FAC runs: batched plus one finiteness check). For comparison, the damped inverse
as kaisa_ds computes it (``compute_method="inverse"``) and a Cholesky inverse. From the fastest eigen method and
BERT-Large's factor sizes follows the seconds of one decomposition round, and from a LAMB step's seconds the
decomposition interval that keeps the round's amortised cost under 1% or 2.5% of a step.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu.bert_cost import PHASE1, kaisa_settings
from benchmarks.gpu.context import Context, save
from benchmarks.harness.machine import machine
from benchmarks.harness.timing import median, timed
from kaisa_ds.decomposition.decompose import decompose_all
from kaisa_ds.enums import ComputeMethod

SHARES = (0.01, 0.025)  # decomposition's part of the 5% K-FAC budget: the rest is statistics and preconditioning
WORLDS = (1, 8)  # KAISA spreads decompositions over the ranks: one GPU, one 8-GPU node


def spd(count: int, n: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(n)
    x = torch.randn(count, 2 * n, n, generator=g).to(device)
    return x.transpose(1, 2) @ x / (2 * n)


def methods(mats: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """Each way of decomposing the whole stack (the streams variant runs as a plain loop on a CPU)."""
    cuda = mats.is_cuda
    streams = [torch.cuda.Stream() for _ in mats] if cuda else [None] * len(mats)
    damped = mats + 1e-3 * torch.eye(mats.shape[-1], device=mats.device)
    named = {f"f{i}": (m, False) for i, m in enumerate(mats)}

    def overlapped() -> None:
        for stream, m in zip(streams, mats):
            if stream is not None:
                stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                torch.linalg.eigh(m)
        for stream in streams:
            if stream is not None:
                torch.cuda.current_stream().wait_stream(stream)

    kw: dict[str, Any] = {"damping": 1e-3, "compute_dtype": torch.float32, "out_dtype": torch.float32}
    return {
        "eigh_loop": lambda: [torch.linalg.eigh(m) for m in mats],
        "eigh_batched": lambda: torch.linalg.eigh(mats),
        "eigh_streams": overlapped,
        "kaisa_ds_eigen": lambda: decompose_all(named, method=ComputeMethod.EIGEN, **kw),
        "kaisa_ds_inverse": lambda: decompose_all(named, method=ComputeMethod.INVERSE, **kw),
        "cholesky_inverse": lambda: torch.cholesky_inverse(torch.linalg.cholesky(damped)),
    }


def time_size(n: int, count: int, device: torch.device, repeats: int) -> dict[str, Any]:
    mats = spd(count, n, device)
    row: dict[str, Any] = {"size": n, "count": count, "repeats": repeats}
    for name, fn in methods(mats).items():
        fn()  # untimed: workspaces, cuSOLVER handles, the streams' first use
        row[f"{name}_s_per_matrix"] = median([timed(fn, cuda=device.type == "cuda") for _ in range(repeats)]) / count
    return row


def bert_factor_dims(size: str) -> dict[int, int]:
    """How many dense factors of each size K-FAC keeps for BERT with the phase-1 config's layers."""
    from kaisa_ds import KFACConfig
    from kaisa_ds.plan.shapes import model_shapes

    kfac = json.loads(PHASE1.read_text())["kfac"]
    cfg = KFACConfig(skip_layers=kfac["skip_layers"], symmetry_aware=kfac.get("symmetry_aware", False))
    shapes, _ = model_shapes(size, cfg, seq=128)
    dims: dict[int, int] = {}
    for f in shapes.factors.values():
        if not f.diagonal:
            dims[f.dim] = dims.get(f.dim, 0) + 1
    return dict(sorted(dims.items()))


def round_seconds(rows: list[dict[str, Any]], dims: dict[int, int], method: str) -> float:
    """One decomposition round on one GPU: each factor timed at the nearest measured size, scaled by n³."""
    total = 0.0
    for dim, count in dims.items():
        near = min(rows, key=lambda r: abs(r["size"] - dim))
        total += count * near[f"{method}_s_per_matrix"] * (dim / near["size"]) ** 3
    return total


def step_seconds(ctx: Context) -> dict[str, float]:
    """LAMB step seconds to size the interval by: this call's step_cost JSON, else ``--step-seconds``."""
    found: dict[str, float] = {}
    path = ctx.out / "gpu_step_cost.json"
    if path.exists():
        for r in json.loads(path.read_text()).get("runs", []):
            found[f"{r['dtype']} LAMB step, micro-batch {r['batch']} (measured)"] = r["baseline_step_s"]
    for s in ctx.args.step_seconds or []:
        found[f"{s:g} s step (given)"] = s
    return found


def intervals(decomp_s: float, steps: dict[str, float]) -> list[dict[str, Any]]:
    return [{"step": label, "step_s": s, "world": w, "share": share,
             "min_inv_update_steps": math.ceil(decomp_s / (share * s * w))}
            for label, s in steps.items() for w in WORLDS for share in SHARES]


def plot(ctx: Context, rows: list[dict[str, Any]]) -> None:
    fig, path = ctx.figure("eigh")
    ax = fig.add_subplot(1, 1, 1)
    names = [k.removesuffix("_s_per_matrix") for k in rows[0] if k.endswith("_s_per_matrix")]
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ax.bar([j + i * width for j in range(len(names))], [1e3 * r[f"{n}_s_per_matrix"] for n in names], width,
               label=f"{r['size']}² ({r['count']} matrices)")
    ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(names))], names, rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("ms per matrix (FP32)")
    ax.set_title(f"decomposition of one factor on {ctx.device.type}")
    ax.legend()
    save(fig, path)


def run(ctx: Context) -> dict[str, Any]:
    sizes = [(64, 3)] if ctx.smoke else [(1024, 8), (4096, 4)]
    repeats = 1 if ctx.smoke else ctx.args.repeats
    rows = [time_size(n, count, ctx.device, repeats) for n, count in sizes]
    dims = bert_factor_dims("tiny" if ctx.smoke else "large")
    eigen = min(("eigh_loop", "eigh_batched", "eigh_streams", "kaisa_ds_eigen"),
                key=lambda m: round_seconds(rows, dims, m))
    per_round = {m: round_seconds(rows, dims, m) for m in ("eigh_loop", "eigh_batched", "eigh_streams",
                                                           "kaisa_ds_eigen", "kaisa_ds_inverse", "cholesky_inverse")}
    out = {"machine": machine(), "sizes": rows, "model": "tiny" if ctx.smoke else "large", "factor_dims": dims,
           "round_seconds_one_gpu": per_round, "fastest_eigen_method": eigen,
           "kaisa_inv_update_steps": kaisa_settings()["inv_every"],
           "intervals": intervals(per_round[eigen], step_seconds(ctx)), "ok": True}
    plot(ctx, rows)
    ctx.write("eigh", out)
    return out
