"""The measurement of ``benchmarks.versus_kfac_pytorch``: a baseline BERT and one copy per library side by side,
rounds with alternating order, per-kind K-FAC costs, the amortised comparison, and each library's peak RSS rise
in its own fresh process."""

from __future__ import annotations

import argparse
import copy
import math
import os
from collections.abc import Callable
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.harness.batches import random_batch
from benchmarks.harness.interval import Interval, amortise
from benchmarks.harness.machine import machine
from benchmarks.harness.memory import peak_bytes, peak_source
from benchmarks.harness.models import bert_for_pretraining, fwd_bwd
from benchmarks.harness.processes import isolated
from benchmarks.harness.side_by_side import SideBySide
from benchmarks.harness.timing import median
from benchmarks.versus_kfac_pytorch.agreement import agreement
from benchmarks.versus_kfac_pytorch.kfac_pytorch import import_kfac, kfac_version
from benchmarks.versus_kfac_pytorch.runners import make_runner
from benchmarks.versus_kfac_pytorch.settings import (
    COMPONENTS,
    COMPUTE_METHOD,
    DAMPING,
    FACTOR_DECAY,
    KL_CLIP,
    LIBRARIES,
    STEP_STAGES,
)
from kaisa_ds.plan.bert_sizes import KAISA_SKIP


def side_by_side(args: argparse.Namespace, device: torch.device) -> SideBySide:
    """A baseline BERT and one copy per library (same weights), sharing one batch; both libraries must
    precondition the same layers."""
    cuda = device.type == "cuda"
    interval = Interval(args.factor_every, args.inv_every)
    base = bert_for_pretraining(args.size, vocab=args.vocab, seq=args.seq).to(device)
    batch = random_batch(args.batch, args.seq, args.vocab, device)
    runners = [make_runner(lib, copy.deepcopy(base), factor_every=args.factor_every, inv_every=args.inv_every,
                           lr=args.lr, cuda=cuda, inv_dtype=args.inv_dtype, sample_fraction=args.sample_fraction,
                           prediv=not args.kfp_no_prediv) for lib in LIBRARIES]
    names = [sorted(r.layer_names()) for r in runners]
    if names[0] != names[1]:
        raise RuntimeError(f"the libraries precondition different layers: {names}")
    return SideBySide(base=base, batch=batch, runners=runners, interval=interval, device=device)


def summarise(rounds: list[dict[str, dict[str, Any]]], agg: Callable[[list[float]], float], *,
              paired: bool) -> dict[str, Any]:
    """Aggregate (median or min) every raw timing over the rounds, then derive per library and kind:
    hook_extra = forward+backward with hooks - the baseline forward+backward run just before it (``paired``: the
    aggregate of the per-round differences, robust to load that drifts over a run; else the difference of the
    aggregates, for the fastest-rounds estimate); hook_machinery = hook_extra - the statistics timed inside the
    hooks; step_other = the part of ``precond.step()`` outside the named stages."""
    kinds = list(rounds[0])
    out: dict[str, Any] = {"baseline_fwd_bwd": agg([r[k][lib]["baseline_fwd_bwd"] for r in rounds for k in kinds
                                                    for lib in LIBRARIES])}
    for lib in LIBRARIES:
        per_kind: dict[str, dict[str, float]] = {}
        for kind in kinds:
            row = {c: agg([r[kind][lib][c] for r in rounds]) for c in rounds[0][kind][lib]}
            runs = [r[kind][lib] for r in rounds]
            row["hook_extra"] = (agg([x["fwd_bwd"] - x["baseline_fwd_bwd"] for x in runs]) if paired
                                 else row["fwd_bwd"] - row["baseline_fwd_bwd"])
            row["hook_machinery"] = row["hook_extra"] - row["factor_capture"]
            row["step_other"] = row["precond_step"] - sum(row[s] for s in STEP_STAGES)
            row["kfac_total"] = row["hook_extra"] + row["precond_step"]
            per_kind[kind] = row
        out[lib] = per_kind
    return out


def speedup(*, kfp_seconds: float, kaisa_seconds: float) -> float:
    """kfac-pytorch's time over kaisa_ds's (> 1: kaisa_ds is faster); NaN when a time is not positive (noise)."""
    if kfp_seconds <= 0 or kaisa_seconds <= 0:
        return math.nan
    return kfp_seconds / kaisa_seconds


def compare(summary: dict[str, Any], interval: Interval) -> dict[str, Any]:
    """Both libraries' amortised K-FAC time, their overhead over a baseline forward+backward, and the ratio."""
    am = {lib: amortise(summary[lib], interval, components=COMPONENTS) for lib in LIBRARIES}
    base = summary["baseline_fwd_bwd"]
    return {"amortised": am,
            "overhead_of_fwd_bwd": {lib: am[lib]["seconds_per_step"] / base for lib in LIBRARIES},
            "ratio_kfp_over_kaisa": speedup(kfp_seconds=am["kfac-pytorch"]["seconds_per_step"],
                                            kaisa_seconds=am["kaisa_ds"]["seconds_per_step"]),
            "ratio_per_kind": {k: speedup(kfp_seconds=summary["kfac-pytorch"][k]["kfac_total"],
                                          kaisa_seconds=summary["kaisa_ds"][k]["kfac_total"])
                               for k in interval.counts()}}


def _peak_rss(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: a baseline forward+backward, then one library's decomposition step and a plain step;
    how far that raised the process's peak memory, and the library's K-FAC bytes."""
    if cfg["threads"] is not None:
        torch.set_num_threads(cfg["threads"])
    device = torch.device(cfg["device"])
    model = bert_for_pretraining(cfg["size"], vocab=cfg["vocab"], seq=cfg["seq"]).to(device)
    batch = random_batch(cfg["batch"], cfg["seq"], cfg["vocab"], device)
    fwd_bwd(model, batch)
    base = peak_bytes(device)
    runner = make_runner(cfg["library"], model, factor_every=cfg["factor_every"], inv_every=cfg["inv_every"],
                         lr=cfg["lr"], cuda=device.type == "cuda")
    for step in (cfg["inv_every"], 1):
        runner.set_step(step)
        fwd_bwd(model, batch)
        runner.step()
    return {"library": cfg["library"], "peak_delta": peak_bytes(device) - base, **runner.memory(),
            "peak_source": peak_source(device)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    info = machine()
    run = side_by_side(args, device)
    kinds = list(run.interval.counts())
    for i in range(args.warmup):  # allocations, K-FAC structure, first decompositions
        run.round(kinds, first=i % 2)
    rounds = [run.round(kinds, first=i % 2) for i in tqdm(range(args.repeats), desc="rounds", leave=False)]
    if run.runners[0].precond.skipped_windows:  # type: ignore[attr-defined]
        raise RuntimeError("kaisa_ds dropped a window for non-finite values: the timings are not of real steps")
    med, best = summarise(rounds, median, paired=True), summarise(rounds, min, paired=False)
    agree = agreement(args, device)
    cfg = {k: getattr(args, k) for k in ("size", "vocab", "batch", "seq", "factor_every", "inv_every", "lr",
                                         "device", "threads")}
    rss = isolated(_peak_rss, [({**cfg, "library": lib},) for lib in LIBRARIES], parallel=1)
    return {
        "machine": info,
        "settings": {**vars(args), "out": str(args.out), "damping": DAMPING, "factor_decay": FACTOR_DECAY,
                     "kl_clip": KL_CLIP, "compute_method": COMPUTE_METHOD.value, "skip_layers": list(KAISA_SKIP),
                     "kfac_layers": len(run.runners[0].layer_names()), "kfac_pytorch_file": import_kfac().__file__,
                     "kfac_pytorch_version": kfac_version()},
        "step_kinds": med, "comparison": compare(med, run.interval),
        # the same from each timing's fastest round: an estimate less exposed to other work on a shared machine
        "comparison_from_minima": compare(best, run.interval), "step_kinds_minima": best,
        "agreement": agree, "peak_rss": rss, "rounds": rounds, "load_average_1m_after": os.getloadavg()[0],
    }

