"""Part ``step_cost``: BERT-Large phase-1 step cost (seq 128) of LAMB vs LAMB + K-FAC, bf16 and fp16 autocast.

KAISA's intervals and levers come from ds_configs/bert_large_bf16_phase1_kfac.json (factors every 5 steps,
decompositions every 50, fp16 factors, bf16 decompositions, token sampling): each dtype runs exact (every token
feeds the statistics) and with that config's ``factor_sample_fraction``. The micro-batch is the largest of
``--batches`` whose K-FAC factor step fits in 90% of the GPU's memory. The measuring is benchmarks.step_cost's
(two identical models side by side, every kind of step measured, the interval average computed exactly).

A step is one micro-batch by default. ``--job-gpus N`` makes it what one GPU of an N-GPU phase-1 job does per
optimizer step: the config's ``train_batch_size / (N x micro-batch)`` accumulated passes, all timed, with
``--pass-fractions`` of a factor step's passes feeding the statistics. Decompositions then still all run on this one
GPU (measured); ``decomposition_split`` adds what the busiest GPU of the N would do under kaisa_ds's own
assignment, weighting each factor by its size's measured eigh (or inverse) time.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.context import Context, save
from benchmarks.harness.machine import machine
from benchmarks.harness.memory import peak_bytes
from benchmarks.harness.options import dtype_name
from benchmarks.step_cost.calibration import decomposition_times
from benchmarks.step_cost.measure import StepCostRun, build_optimizer, measure
from kaisa_ds.distributed.assignment import assign_work, resolve_grad_workers
from kaisa_ds.engine.ds_config import parse_kfac_section
from kaisa_ds.enums import ComputeMethod
from kaisa_ds.plan.shapes import shapes_of

REPO = Path(__file__).resolve().parents[2]
PHASE1 = REPO / "ds_configs" / "bert_large_bf16_phase1_kfac.json"
MEMORY_SHARE = 0.9  # the probe's peak must stay under this share of the GPU: decompositions come on top
# stages of the amortised overhead: step_cost's components grouped as KAISA reports them
STAGES = {"statistics": ("hook_extra",), "reduction": ("factor_reduction", "gradient_broadcast"),
          "decomposition": ("decomposition",), "preconditioning": ("preconditioning", "kl_clip", "write_grads"),
          "other": ("step_untimed",)}
TARGET = 0.05  # amortised K-FAC overhead at BERT-Large with the levers, share of a bf16 LAMB step


def kaisa_settings(path: Path = PHASE1) -> dict[str, Any]:
    """Intervals and levers of the phase-1 K-FAC config (the numbers KAISA's BERT-Large runs use)."""
    ds = json.loads(path.read_text())
    config = parse_kfac_section(ds).config  # the library's reader: its defaults for what the file leaves out
    if config is None:
        raise ValueError(f"{path}: kfac is not enabled; the GPU step cost measures that config's K-FAC settings")
    return {"factor_every": config.factor_update_steps, "inv_every": config.inv_update_steps,
            "factor_dtype": dtype_name(config.factor_dtype, name="factor_dtype"),
            "inv_dtype": dtype_name(config.inv_dtype_on(torch.device("cuda")), name="inv_dtype"),  # "auto" on a GPU
            "sample_fraction": config.factor_sample_fraction, "grad_worker_fraction": config.grad_worker_fraction,
            "grafting": config.grafting, "train_batch_size": ds["train_batch_size"],
            "config": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)}


def accumulation(ctx: Context, batch: int) -> int:
    """Passes per optimizer step: 1, or one GPU's share of the phase-1 global batch in a ``--job-gpus`` job."""
    gpus = ctx.args.job_gpus
    if not gpus:
        return 1
    if ctx.smoke:
        return 2  # the accumulation's code at toy cost
    return max(1, kaisa_settings()["train_batch_size"] // (gpus * batch))


def step_args(ctx: Context, *, dtype: str, batch: int, sample_fraction: float, pass_fraction: float = 1.0,
              method: ComputeMethod = ComputeMethod.EIGEN, passes: int = 1) -> argparse.Namespace:
    """benchmarks.step_cost's arguments for one configuration (toy shapes in the CPU smoke)."""
    k = kaisa_settings()
    smoke = ctx.smoke
    return argparse.Namespace(
        size="tiny" if smoke else "large", dtype=dtype, batch=batch, seq=16 if smoke else 128,
        vocab=300 if smoke else 30522, lr=6e-3, factor_every=2 if smoke else k["factor_every"],
        inv_every=4 if smoke else k["inv_every"], factor_dtype=k["factor_dtype"], sample_fraction=sample_fraction,
        compute_method=method, inv_dtype=ctx.args.inv_dtype or k["inv_dtype"],
        repeats=1 if smoke else ctx.args.repeats,
        accumulation=passes, pass_fraction=pass_fraction,
        damping=None, relative_damping=ctx.args.relative_damping, grafting=k["grafting"],
        warmup=1, device=str(ctx.device), threads=None, decomp_sizes=[], decomp_repeats=1,
        out=ctx.out / "gpu_step_cost.json")


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def largest_batch(ctx: Context, candidates: list[int], dtype: str) -> tuple[int, list[dict[str, Any]]]:
    """The largest candidate micro-batch whose baseline step and K-FAC factor step fit; the probe's record.

    Each candidate gets fresh models: a pass cut off by an out-of-memory error leaves half-filled factor windows."""
    total = torch.cuda.get_device_properties(0).total_memory if ctx.device.type == "cuda" else None
    tried: list[dict[str, Any]] = []
    for batch in sorted(candidates, reverse=True):
        free()
        run = None
        try:
            run = StepCostRun(step_args(ctx, dtype=dtype, batch=batch, sample_fraction=1.0), ctx.device)
            run.round(["factor"])
        except torch.OutOfMemoryError:
            tried.append({"batch": batch, "fits": False, "why": "out of memory"})
            continue
        finally:
            del run
        peak = peak_bytes(ctx.device) if total else 0
        fits = total is None or peak <= MEMORY_SHARE * total
        tried.append({"batch": batch, "fits": fits, "peak_gib": peak / 2**30})
        if fits:
            free()
            return batch, tried
    raise RuntimeError(f"no micro-batch of {candidates} fits on this GPU: {tried}")


def warm_optimizer(ctx: Context) -> dict[str, Any]:
    """Build the LAMB the baseline will use once, on a toy module: DeepSpeed's FusedLamb JIT-compiles on its first
    use (a minute or more on a fresh machine), which must not count as a configuration's time."""
    start = time.monotonic()
    _, name = build_optimizer(torch.nn.Linear(2, 2).to(ctx.device), lr=1e-3)
    return {"optimizer": name, "first_build_s": time.monotonic() - start}


def stage_shares(res: dict[str, Any]) -> dict[str, float]:
    """Amortised seconds per step of each stage as a share of the baseline (LAMB) step."""
    per = res["amortised"]["components_seconds_per_step"]
    step = res["baseline"]["step_s"]
    return {stage: sum(per[c] for c in parts) / step for stage, parts in STAGES.items()}


def label(row: dict[str, Any]) -> str:
    """A configuration's bar label: dtype, method, token and pass sampling."""
    parts = [row["dtype"], row.get("method", "eigen")]
    parts.append("exact" if row["sample_fraction"] == 1 else f"tokens {row['sample_fraction']:g}")
    if row.get("pass_fraction", 1.0) < 1:
        parts.append(f"passes {row['pass_fraction']:g}")
    return "\n".join(parts)


def plot(ctx: Context, rows: list[dict[str, Any]]) -> None:
    fig, path = ctx.figure("step_cost")
    ax = fig.add_subplot(1, 1, 1)
    labels = [label(r) for r in rows]
    bottom = [0.0] * len(rows)
    for stage in STAGES:
        values = [100 * r["stage_shares"][stage] for r in rows]
        ax.bar(labels, values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(100 * TARGET, color="k", linestyle="--", label=f"target {100 * TARGET:g}%")
    ax.set_ylabel("amortised K-FAC time, % of a LAMB step")
    model = rows[0]["model"]
    per_step = rows[0].get("accumulation", 1)
    ax.set_title(f"BERT-{model} seq {rows[0]['seq']}, micro-batch {rows[0]['batch']} x {per_step} passes per step: "
                 "K-FAC overhead by stage")
    for i, r in enumerate(rows):
        if r.get("decomposition_split"):
            ax.plot(i, 100 * r["decomposition_split"]["overhead_split"], "kv",
                    label=f"decompositions split over {r['decomposition_split']['job_gpus']} GPUs" if i == 0 else None)
    ax.legend()
    save(fig, path)


def decomposition_split(run: StepCostRun, res: dict[str, Any], *, gpus: int, device: torch.device) -> dict[str, Any]:
    """The decomposition share of the busiest of ``gpus`` GPUs: kaisa_ds's assignment of this model's factors, each
    weighted by its size's measured decomposition time, applied to the decomposition time measured on this GPU."""
    kfac = run.kfac
    shapes = shapes_of(kfac.candidates, fired=kfac.capture.fired, same_input=kfac.capture.same_input)
    workers = resolve_grad_workers(kaisa_settings()["grad_worker_fraction"], gpus)
    assignment = assign_work(shapes.work, world=gpus, grad_workers=workers)
    dims = sorted({f.dim for f in shapes.factors.values() if not f.diagonal})
    key = "eigh_fp32_s" if kfac.config.method is ComputeMethod.EIGEN else "inverse_fp32_s"
    seconds = {d["size"]: d[key] for d in decomposition_times(dims, device, repeats=1)}
    per_rank = [0.0] * gpus
    for name, rank in assignment.inverse_worker.items():
        f = shapes.factors[name]
        per_rank[rank] += 0.0 if f.diagonal else seconds[f.dim]
    busiest = max(per_rank) / sum(per_rank)
    share = stage_shares(res)["decomposition"]
    overhead = res["amortised"]["overhead"]
    return {"job_gpus": gpus, "grad_workers": workers, "seconds_per_size": seconds, "busiest_share": busiest,
            "decomposition_share_one_gpu": share, "decomposition_share_busiest": share * busiest,
            "overhead_split": overhead - share * (1.0 - busiest)}


def configurations(ctx: Context, dtypes: list[str], k: dict[str, Any]) -> list[dict[str, Any]]:
    """Every configuration of this call, levers in the order given (the budget skips the last ones)."""
    fractions = ctx.args.sample_fractions or (1.0, k["sample_fraction"])
    methods = [ComputeMethod(m) for m in ctx.args.compute_methods]
    return [{"dtype": d, "method": m, "pass_fraction": pf, "sample_fraction": f}
            for d in dtypes for m in methods for pf in ctx.args.pass_fractions for f in fractions]


def run(ctx: Context) -> dict[str, Any]:
    k = kaisa_settings()
    dtypes = ["bf16"] if ctx.smoke else ctx.args.dtypes
    candidates = [2] if ctx.smoke else ctx.args.batches
    lamb = warm_optimizer(ctx)
    batch, probe = largest_batch(ctx, candidates, dtypes[0])
    passes = accumulation(ctx, batch)
    out: dict[str, Any] = {"machine": machine(), "kaisa": k, "lamb": lamb, "micro_batch": batch, "probe": probe,
                           "accumulation": passes, "job_gpus": ctx.args.job_gpus, "runs": [],
                           "target_overhead": TARGET, "skipped": [], "failed": []}
    for conf in configurations(ctx, dtypes, k):
        started = time.monotonic()
        if out["runs"] and ctx.seconds_left() < 1.2 * out["runs"][-1]["seconds"]:
            out["skipped"].append({**conf, "method": conf["method"].value, "why": "call's time budget"})
            continue
        measured = None
        try:
            args = step_args(ctx, dtype=conf["dtype"], batch=batch, sample_fraction=conf["sample_fraction"],
                             pass_fraction=conf["pass_fraction"], method=conf["method"], passes=passes)
            measured = StepCostRun(args, ctx.device)
            res = measure(args, run=measured)
            split = (decomposition_split(measured, res, gpus=ctx.args.job_gpus, device=ctx.device)
                     if ctx.args.job_gpus else None)
        except Exception as exc:  # e.g. fp16 windows dropped as non-finite: keep the other configurations
            out["failed"].append({**conf, "method": conf["method"].value, "error": f"{type(exc).__name__}: {exc}",
                                  "traceback": traceback.format_exc()})
            ctx.write("step_cost", out)
            continue
        finally:
            del measured
            free()
        s = res["settings"]
        out["runs"].append({
            **conf, "method": conf["method"].value, "inv_dtype": s["inv_dtype"], "model": s["size"], "seq": s["seq"],
            "batch": batch,
            "accumulation": passes, "optimizer": s["optimizer"], "baseline_step_s": res["baseline"]["step_s"],
            "overhead": res["amortised"]["overhead"], "stage_overhead": res["amortised"]["stage_overhead"],
            "overhead_from_minima": res["amortised_from_minima"]["overhead"], "stage_shares": stage_shares(res),
            "decomposition_split": split, "meets_target": res["amortised"]["overhead"] <= TARGET,
            "seconds": time.monotonic() - started,
            "step_cost": {key: res[key] for key in ("settings", "baseline", "step_kinds", "amortised")}})
        ctx.write("step_cost", out)  # after every configuration: a call cut short keeps what it measured
    if out["runs"]:
        plot(ctx, out["runs"])
    out["ok"] = bool(out["runs"]) and not out["failed"]
    ctx.write("step_cost", out)
    return out
