"""Part ``defaults``: what ``"kfac": {"enabled": true}`` adds to a LAMB step on one GPU, issue 59's three targets:
BERT-base bf16 256 × 128 (≤ 10%), BERT-mini 256 × 32 fp32 (≤ 20%), a BERT-Large phase-1 step, 64 × 128 bf16
(≤ 3%). Each case is ``benchmarks.default_overhead`` on the GPU (two copies side by side, steps alternating, LAMB in
both, every K-FAC option at its default: the method, the cost rule's interval, the statistics' cap), measured after
the cost rule has set the interval; a case the call's time no longer fits is skipped and said so."""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.default_overhead import measure
from benchmarks.gpu.context import Context
from benchmarks.harness.machine import machine

CASES = (("base", 256, 128, "bf16", 0.10), ("mini", 256, 32, "fp32", 0.20), ("large", 64, 128, "bf16", 0.03))
SMOKE = (("tiny", 4, 16, "fp32", 1.0),)


def run(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine(), "cases": [], "skipped": []}
    for size, batch, seq, dtype, target in SMOKE if ctx.smoke else CASES:
        if out["cases"] and ctx.seconds_left() < 1.3 * out["cases"][-1]["seconds"]:
            out["skipped"].append({"size": size, "why": "call's time budget"})
            continue
        started = time.monotonic()
        args = argparse.Namespace(size=size, batch=batch, seq=seq, dtype=dtype, optimizer="lamb", lr=1e-3,
                                  steps=8 if ctx.smoke else 100, warmup_limit=155 if ctx.smoke else 40,
                                  device=str(ctx.device), threads=None)
        res = measure(args)
        out["cases"].append({"size": size, "batch": batch, "seq": seq, "dtype": dtype, "target": target,
                             "overhead": res["overhead"], "met": res["overhead"] <= target,
                             "inv_update_steps": res["inv_update_steps"], "cost_interval": res["cost_interval"],
                             "compute_method": res["compute_method"],
                             "stage_share_of_baseline": res["stage_share_of_baseline"],
                             "seconds": time.monotonic() - started})
        ctx.write("defaults", out)
    out["ok"] = bool(out["cases"])
    ctx.write("defaults", out)
    return out
