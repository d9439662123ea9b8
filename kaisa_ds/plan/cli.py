"""``python -m kaisa_ds.plan``: plan a K-FAC (KAISA) run before launching it.

Prints, per rank: factor, window and decomposition memory; the bytes of each collective by kind of step;
the decomposition work per rank from the real longest-job-first assignment and its imbalance; and, given
measured rates, the predicted amortised overhead. The model is built on the ``meta`` device (no memory),
so BERT-Large plans in seconds. Choose ``grad_worker_fraction`` for a memory budget by comparing fractions.

    python -m kaisa_ds.plan --model large --world 64 --micro-batch 64 --seq 128 --grad-worker-fraction 0.5 \\
        --factor-dtype fp16
    python -m kaisa_ds.plan --model large --ds-config ds_configs/bert_large_phase1_fp16_kfac.json --world 64 --json
    python -m kaisa_ds.plan --model mini --world 4 --calibration benchmarks/results/step_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kaisa_ds.config import KFACConfig
from kaisa_ds.engine.ds_config import ENGINE_KEYS, load_config
from kaisa_ds.plan.bert_sizes import KAISA_SKIP
from kaisa_ds.plan.overhead import bert_step_flops, rates_from, read_calibration
from kaisa_ds.plan.shapes import bert_shapes
from kaisa_ds.plan.summary import MEMORY_PARTS, make_plan

MB = 2**20


def _size_seconds(text: str) -> tuple[int, float]:
    try:
        size, seconds = text.split("=")
        return int(size), float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected SIZE=SECONDS, e.g. 4096=0.8") from None


def _fraction(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text  # a strategy name, validated by KFACConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kaisa_ds.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a BERT size (tiny, mini, base, large) or an HF folder with "
                   "config.json")
    p.add_argument("--ds-config", type=Path, help="a DeepSpeed JSON: its kfac section and micro-batch (flags win)")
    p.add_argument("--world", type=int, required=True, help="number of ranks (GPUs)")
    p.add_argument("--micro-batch", type=int, help="sequences per rank per pass (default: the JSON's, else 32)")
    p.add_argument("--seq", type=int, default=128, help="sequence length (default: %(default)s)")
    p.add_argument("--passes", type=int, help="accumulation passes per step (default: from the JSON, else 1)")
    p.add_argument("--vocab", type=int, default=30522, help="vocabulary of a named size (default: %(default)s)")
    k = p.add_argument_group("K-FAC options (override the JSON's kfac section; validated by KFACConfig)")
    k.add_argument("--grad-worker-fraction", type=_fraction, help="k/world, or comm-opt, hybrid-opt, mem-opt")
    k.add_argument("--factor-dtype", help="fp32, fp16 or bf16")
    k.add_argument("--inv-dtype", help="fp32, bf16 or fp16")
    k.add_argument("--factor-update-steps", type=int)
    k.add_argument("--inv-update-steps", type=int)
    k.add_argument("--compute-method", help="eigen or inverse")
    k.add_argument("--symmetry-aware", action=argparse.BooleanOptionalAction, default=None)
    k.add_argument("--factor-sample-fraction", type=float)
    k.add_argument("--factor-pass-fraction", type=float)
    k.add_argument("--skip-layers", nargs="*", help=f"regexes (default: the JSON's, else {' '.join(KAISA_SKIP)})")
    r = p.add_argument_group("rates for the predicted overhead (flags win over --calibration)")
    r.add_argument("--calibration", type=Path, help="the JSON python -m benchmarks.step_cost writes")
    r.add_argument("--gemm-gflops", type=float, help="GEMM rate of the statistics and the preconditioning")
    r.add_argument("--eigh-seconds", type=_size_seconds, nargs="*", default=[], metavar="SIZE=SECONDS",
                   help="one FP32 eigh per factor size (other sizes scale as n³ from the nearest)")
    r.add_argument("--inverse-seconds", type=_size_seconds, nargs="*", default=[], metavar="SIZE=SECONDS")
    r.add_argument("--step-seconds", type=float, help="measured baseline step; default: the calibration's when "
                   "its model, micro-batch and seq match, else estimated from the model's FLOPs")
    r.add_argument("--network-gbps", type=float, help="per-rank bandwidth, to count the collectives' time")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return p


def kfac_config(args: argparse.Namespace, ds: dict[str, Any] | None) -> KFACConfig:
    section = dict((ds or {}).get("kfac") or {})
    options = {key: v for key, v in section.items() if key not in ENGINE_KEYS}
    if "skip_layers" not in options:
        options["skip_layers"] = list(KAISA_SKIP)
    flags = {"grad_worker_fraction": args.grad_worker_fraction, "factor_dtype": args.factor_dtype,
             "inv_dtype": args.inv_dtype, "factor_update_steps": args.factor_update_steps,
             "inv_update_steps": args.inv_update_steps, "compute_method": args.compute_method,
             "symmetry_aware": args.symmetry_aware, "factor_sample_fraction": args.factor_sample_fraction,
             "factor_pass_fraction": args.factor_pass_fraction, "skip_layers": args.skip_layers}
    return KFACConfig.from_dict(options, **{key: v for key, v in flags.items() if v is not None})


def _batch(args: argparse.Namespace, ds: dict[str, Any] | None) -> tuple[int, int]:
    ds = ds or {}
    micro = args.micro_batch or int(ds.get("train_micro_batch_size_per_gpu", 32))
    passes = args.passes or int(ds.get("gradient_accumulation_steps", 0) or 0)
    if not passes and "train_batch_size" in ds:
        passes = max(1, int(ds["train_batch_size"]) // (micro * args.world))
    return micro, passes or 1


def plan_from_args(args: argparse.Namespace) -> dict[str, Any]:
    ds = load_config(args.ds_config) if args.ds_config else None
    config = kfac_config(args, ds)
    micro, passes = _batch(args, ds)
    shapes, bert_cfg = bert_shapes(args.model, config, seq=args.seq, vocab=args.vocab)
    cal = read_calibration(args.calibration) if args.calibration else None
    step_seconds = args.step_seconds
    if step_seconds is None and cal and cal.get("settings", {}) == {"model": args.model, "micro_batch": micro,
                                                                     "seq": args.seq}:
        step_seconds = cal.get("baseline_step_s")
    rates = rates_from(cal, gemm_gflops=args.gemm_gflops, eigh_seconds=dict(args.eigh_seconds),
                       inverse_seconds=dict(args.inverse_seconds), step_seconds=step_seconds,
                       network_gbps=args.network_gbps)
    plan = make_plan(shapes, config, world=args.world, micro_batch=micro, seq=args.seq, passes=passes, rates=rates,
                     baseline_flops=bert_step_flops(bert_cfg, micro_batch=micro, seq=args.seq, passes=passes))
    plan["model"] = str(args.model)
    plan["kfac"] = {"grad_worker_fraction": str(config.grad_worker_fraction), "factor_dtype": str(config.factor_dtype),
                    "inv_dtype": str(config.inv_dtype), "compute_method": config.method.value,
                    "symmetry_aware": config.symmetry_aware, "factor_sample_fraction": config.factor_sample_fraction,
                    "factor_pass_fraction": config.factor_pass_fraction, "skip_layers": list(config.skip_layers)}
    return plan


def render(plan: dict[str, Any]) -> str:
    """The plan as text tables (MiB and KiB)."""
    k = plan["kfac"]
    lines = [f"K-FAC plan: BERT {plan['model']}, {plan['layers']} layers / {plan['factors']} factors, world "
             f"{plan['world']}, {plan['strategy']} ({plan['grad_workers']} gradient workers per layer), micro-batch "
             f"{plan['micro_batch']}x{plan['seq']} x{plan['passes']} passes; factors every "
             f"{plan['factor_update_steps']}, decompositions every {plan['inv_update_steps']} steps; factor_dtype "
             f"{k['factor_dtype']}, inv_dtype {k['inv_dtype']}, {k['compute_method']}, symmetry_aware "
             f"{k['symmetry_aware']}", "", "memory per rank (MiB)     busiest rank      mean"]
    mem = plan["memory_bytes"]
    for part in MEMORY_PARTS:
        lines.append(f"  {part:<22}{mem['max_rank'][part] / MB:>14.1f}{mem['mean'][part] / MB:>10.1f}")
    lines.append(f"  {'total':<22}{plan['memory_bytes_per_rank'] / MB:>14.1f}")
    t = plan["traffic"]
    lines += ["", f"payload per rank (KiB, max / mean over ranks); one period = {t['period_steps']} steps: "
              + ", ".join(f"{n} {kind}" for kind, n in t["step_counts"].items())]
    kinds = list(t["payload_bytes_per_rank"]) + ["amortised"]
    lines.append(f"  {'collective':<26}" + "".join(f"{kind:>26}" for kind in kinds))
    for stage in ("factor_allreduce", "decomposition_broadcast", "gradient_broadcast", "total"):
        cells = [t["payload_bytes_per_rank"][kd][stage] for kd in kinds[:-1]] + [t["amortised_bytes_per_rank"][stage]]
        lines.append(f"  {stage:<26}" + "".join(f"{c['max'] / 1024:>16.1f} / {c['mean'] / 1024:<7.1f}"
                                                  for c in cells))
    w = plan["decomposition_work_per_rank"]
    lines += ["", f"decomposition work per rank (n³ units): max {w['max']:.4g}, mean {w['mean']:.4g}, largest single "
              f"{w['largest_single']:.4g}; imbalance max/mean {plan['decomposition_imbalance']:.3f} (bound "
              f"{plan['decomposition_imbalance_bound']:.3f})"]
    o = plan["overhead"]
    if o is None:
        lines.append("predicted overhead: give --gemm-gflops and --eigh-seconds, or --calibration")
    else:
        per = ", ".join(f"{kind} {v['total'] * 1e3:.1f} ms" for kind, v in o["seconds_per_step_kind"].items())
        share = (f" = {100 * o['amortised_overhead']:.1f}% of a {o['baseline_step_seconds']:.3g} s baseline step "
                 f"({o['baseline_source']})" if o["amortised_overhead"] is not None else "")
        lines.append(f"predicted K-FAC time: {per}; amortised {o['amortised_seconds'] * 1e3:.1f} ms/step{share}"
                     + ("" if o["communication_counted"] else "; collectives not counted (no --network-gbps)"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = build_parser()
    args = p.parse_args(argv)
    if args.world < 1:
        p.error("--world must be at least 1")
    try:
        plan = plan_from_args(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    print(json.dumps(plan) if args.json else render(plan))
    return plan
