"""``python -m kaisa_ds.plan``: plan a K-FAC (KAISA) run before launching it.

Prints, per rank: factor, window and decomposition memory; the bytes of each collective by kind of step;
the decomposition work per rank from the real longest-job-first assignment and its imbalance; and, given
measured rates, the predicted amortised overhead. The model is built on the ``meta`` device (no memory),
so BERT-Large plans in seconds. Choose ``grad_worker_fraction`` for a memory budget by comparing fractions.

    python -m kaisa_ds.plan --model large --world 64 --micro-batch 64 --seq 128 --grad-worker-fraction 0.5 \\
        --factor-dtype fp16
    python -m kaisa_ds.plan --model large --ds-config ds_configs/bert_large_fp16_phase1_kfac.json --world 64 --json
    python -m kaisa_ds.plan --model mini --world 4 --calibration benchmarks/results/step_cost.json
    python -m kaisa_ds.plan --model tiny --ds-config examples/ds_config_kfac.json --world 2 --micro-batch 8 --passes 2

An HF config's "auto" batch keys are filled by the Trainer from its arguments: give them as --micro-batch and
--passes. A flag the plan would not use (rates without a GEMM rate, --vocab with a model folder, a timing for the
other decomposition method) is refused; a config the engine refuses is refused here too.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.registry import METHODS, method_for
from kaisa_ds.engine.ds_config import ENGINE_KEYS, KFACSection, check_supported, load_config, parse_kfac_section
from kaisa_ds.enums import ComputeMethod
from kaisa_ds.optim.select import is_lamb_config
from kaisa_ds.plan.batch import DEFAULT_MICRO, resolve_batch
from kaisa_ds.plan.bert_sizes import KAISA_SKIP
from kaisa_ds.plan.memory import inv_dtype_label, planned_method
from kaisa_ds.plan.overhead import bert_step_flops, rates_from, read_calibration, transformer_step_flops
from kaisa_ds.plan.shapes import is_bert, max_positions, model_config, model_shapes
from kaisa_ds.plan.summary import MEMORY_PARTS, make_plan

MB = 2**20
DEFAULT_VOCAB = 30522  # BERT's WordPiece vocabulary, for a named size
logger = logging.getLogger(__name__)


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
                   "config.json (any model type: Llama, GPT-2, T5, ...)")
    p.add_argument("--ds-config", type=Path, help="a DeepSpeed JSON: its kfac section and batch keys (flags win; "
                   "HF \"auto\" batch keys need --micro-batch / --passes)")
    p.add_argument("--world", type=int, required=True, help="number of ranks (GPUs)")
    p.add_argument("--cpu-ranks", action="store_true", help="plan CPU ranks (gloo), where grad_worker_fraction "
                   "'auto' (the default) is MEM-OPT; default: GPUs, where it is COMM-OPT")
    p.add_argument("--micro-batch", type=int, help="sequences per rank per pass (default: from the JSON's batch keys "
                   f"as DeepSpeed derives it, else {DEFAULT_MICRO})")
    p.add_argument("--seq", type=int, default=128, help="sequence length (default: %(default)s)")
    p.add_argument("--passes", type=int, help="accumulation passes per step (default: from the JSON, else 1)")
    p.add_argument("--vocab", type=int, help=f"vocabulary of a named size (default: {DEFAULT_VOCAB}; a folder's "
                   "config.json sets its own)")
    k = p.add_argument_group("K-FAC options (override the JSON's kfac section; validated by KFACConfig)")
    k.add_argument("--grad-worker-fraction", type=_fraction, help="k/world, or comm-opt, hybrid-opt, mem-opt")
    k.add_argument("--factor-dtype", help="fp32, fp16 or bf16")
    k.add_argument("--inv-dtype", help="fp32, bf16 or fp16")
    k.add_argument("--factor-update-steps", type=int)
    k.add_argument("--inv-update-steps", type=_interval, help="an integer, or 'auto' (the default: set by the "
                   "statistic rows per factor update)")
    k.add_argument("--compute-method", help=f"{', '.join(sorted(m.value for m in METHODS))} or auto")
    k.add_argument("--max-statistic-rows", type=int, help="the rows one factor update takes in over every rank")
    k.add_argument("--max-factor-ratio", type=_ratio, help="a dense factor more than this many times its layer's "
                   "other side keeps only its diagonal (default 2: one-sided rotation); 'none' rotates both sides")
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


BOTH_SIDES = "none"  # --max-factor-ratio's value for None: every factor whole up to max_factor_dim


def _ratio(text: str) -> float | str:
    """``--max-factor-ratio``: a number, or ``none`` (both sides of every layer rotated)."""
    if text.lower() in (BOTH_SIDES, "null"):
        return BOTH_SIDES
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number nor 'none'") from None


def _interval(text: str) -> int | str:
    """``--inv-update-steps``: ``auto`` or an integer."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'auto' nor an integer") from None


def kfac_config(args: argparse.Namespace, ds: dict[str, Any] | None, *, bert: bool = True) -> KFACConfig:
    """The run's K-FAC options: the JSON's section, then the flags; a BERT model's skip list defaults to KAISA's
    (``bert_pretrain`` trains BERT so), any other model's to the library's (none)."""
    section = dict((ds or {}).get("kfac") or {})
    options = {key: v for key, v in section.items() if key not in ENGINE_KEYS}
    if "skip_layers" not in options and bert:
        options["skip_layers"] = list(KAISA_SKIP)
    flags = {"grad_worker_fraction": args.grad_worker_fraction, "factor_dtype": args.factor_dtype,
             "inv_dtype": args.inv_dtype, "factor_update_steps": args.factor_update_steps,
             "inv_update_steps": args.inv_update_steps, "compute_method": args.compute_method,
             "symmetry_aware": args.symmetry_aware, "factor_sample_fraction": args.factor_sample_fraction,
             "factor_pass_fraction": args.factor_pass_fraction, "skip_layers": args.skip_layers,
             "max_statistic_rows": args.max_statistic_rows, "max_factor_ratio": args.max_factor_ratio}
    given = {key: (None if v == BOTH_SIDES else v) for key, v in flags.items() if v is not None}
    return KFACConfig.from_dict(options, **given)


def _kfac_section(ds: dict[str, Any], source: str) -> None:
    """Validate the JSON's kfac section as the engine does, refuse what the engine refuses, and say when the config
    would run without K-FAC (the plan is then of what K-FAC would cost, with the flags' and defaults' settings)."""
    section = parse_kfac_section(ds)
    if not section.enabled:
        logger.warning("%s: %s, so K-FAC is off in the run it configures; planning K-FAC with the section's keys, "
                       "the flags and the defaults", source,
                       "kfac.enabled is false" if "kfac" in ds else "there is no kfac section")
    on = KFACSection(enabled=True, auto_step=section.auto_step, config=section.config)
    check_supported(ds, on, lamb=is_lamb_config(ds.get("optimizer")))


def check_options(args: argparse.Namespace, cfg: Any) -> None:
    """Refuse flags this plan would take and then not use (each names the flag and the fix)."""
    if Path(args.model).is_dir() and args.vocab is not None and args.vocab != cfg.vocab_size:
        raise ValueError(f"--vocab {args.vocab} with --model {args.model}: the folder's config.json sets vocab_size "
                         f"{cfg.vocab_size}; --vocab is for a named size, leave it out")
    limit = max_positions(cfg)
    if not 1 <= args.seq <= (limit or args.seq):
        raise ValueError(f"--seq {args.seq} is outside 1..{limit} (the model's max_position_embeddings); give a "
                         "--seq in that range")
    rates = {"--eigh-seconds": args.eigh_seconds, "--inverse-seconds": args.inverse_seconds,
             "--step-seconds": args.step_seconds, "--network-gbps": args.network_gbps}
    rated = [flag for flag, value in rates.items() if value not in (None, [])]
    if rated and args.gemm_gflops is None and args.calibration is None:
        raise ValueError(f"{', '.join(rated)} only count in the predicted overhead, which needs a GEMM rate: add "
                         "--gemm-gflops or --calibration (or leave them out)")


def check_method_rates(args: argparse.Namespace, config: KFACConfig) -> None:
    """A decomposition timing for the method the run does not use would be ignored: refuse it."""
    reads = method_for(planned_method(config, cpu_ranks=args.cpu_ranks)).rate_flag
    for kind, impl in METHODS.items():
        unused = impl.rate_flag
        if kind is ComputeMethod.EIGEN_REFRESH:
            continue  # reads the eigh timings too (its first decomposition, fallbacks)
        if unused != reads and getattr(args, unused[2:].replace("-", "_")):
            raise ValueError(f"{unused} with compute_method {config.method.value}: the run makes no such "
                             f"decompositions; leave it out, or set --compute-method {kind.value}")


def calibrated_step(cal: dict[str, Any] | None, *, model: str, micro: int, seq: int, passes: int) -> float | None:
    """The calibration's measured baseline step when it was measured at this run's settings and passes per step
    (benchmarks.step_cost's ``--accumulation``), else None, saying why: the overhead's baseline is then estimated
    from the model's FLOPs."""
    if not cal or cal.get("baseline_step_s") is None:
        return None
    ours = {"model": model, "micro_batch": micro, "seq": seq}
    measured_passes = int(cal.get("passes", 1))
    if cal.get("settings", {}) == ours and passes == measured_passes:
        return float(cal["baseline_step_s"])
    logger.warning("--calibration: its baseline step was measured at %s with %d pass(es), this plan is %s with %d "
                   "pass(es); the baseline is estimated from the model's FLOPs instead (give --step-seconds for a "
                   "measured one)", cal.get("settings"), measured_passes, ours, passes)
    return None


def plan_from_args(args: argparse.Namespace) -> dict[str, Any]:
    ds = load_config(args.ds_config) if args.ds_config else None
    if ds is not None:
        _kfac_section(ds, str(args.ds_config))
    model_cfg = model_config(args.model, vocab=args.vocab or DEFAULT_VOCAB)
    config = kfac_config(args, ds, bert=is_bert(model_cfg))
    check_method_rates(args, config)
    batch = resolve_batch(ds, micro=args.micro_batch, passes=args.passes, world=args.world,
                          source=str(args.ds_config))
    micro, passes = batch.micro, batch.passes
    check_options(args, model_cfg)
    shapes, model_cfg = model_shapes(args.model, config, seq=args.seq, vocab=args.vocab or DEFAULT_VOCAB)
    cal = read_calibration(args.calibration) if args.calibration else None
    step_seconds = args.step_seconds if args.step_seconds is not None else calibrated_step(
        cal, model=str(args.model), micro=micro, seq=args.seq, passes=passes)
    rates = rates_from(cal, gemm_gflops=args.gemm_gflops, eigh_seconds=dict(args.eigh_seconds),
                       inverse_seconds=dict(args.inverse_seconds), step_seconds=step_seconds,
                       network_gbps=args.network_gbps)
    plan = make_plan(shapes, config, world=args.world, micro_batch=micro, seq=args.seq, passes=passes, rates=rates,
                     baseline_flops=(bert_step_flops if is_bert(model_cfg) else transformer_step_flops)(
                         model_cfg, micro_batch=micro, seq=args.seq, passes=passes, shapes=shapes),
                     cpu_ranks=args.cpu_ranks)
    plan["model"] = str(args.model)
    plan["model_type"] = model_cfg.model_type
    if shapes.coverage is not None:
        plan["coverage"] = shapes.coverage.summary()
    fraction = config.grad_worker_fraction
    plan["kfac"] = {"grad_worker_fraction": str(getattr(fraction, "value", fraction)),
                    "factor_dtype": str(config.factor_dtype),
                    "inv_dtype": inv_dtype_label(config, cpu_ranks=args.cpu_ranks),
                    "compute_method": planned_method(config, cpu_ranks=args.cpu_ranks).value,
                    "symmetry_aware": config.symmetry_aware, "factor_sample_fraction": config.factor_sample_fraction,
                    "factor_pass_fraction": config.factor_pass_fraction, "skip_layers": list(config.skip_layers)}
    return plan


def render(plan: dict[str, Any]) -> str:
    """The plan as text tables (MiB and KiB)."""
    k = plan["kfac"]
    cost = plan.get("inv_update_steps_cost_rule")
    auto = (f" (auto: {plan['statistic_rows']} statistic rows per update"
            + (f"; the cost rule asks {cost}" if cost is not None else "; give rates for the cost rule") + ")"
            if plan.get("inv_update_steps_auto") else "")
    lines = [f"K-FAC plan: {plan['model_type']} {plan['model']}, {plan['layers']} layers / {plan['factors']} factors, "
             f"world {plan['world']}, {plan['strategy']} ({plan['grad_workers']} gradient workers per layer), "
             f"micro-batch {plan['micro_batch']}x{plan['seq']} x{plan['passes']} passes; factors every "
             f"{plan['factor_update_steps']}, decompositions every {plan['inv_update_steps']} steps{auto}; "
             f"factor_dtype {k['factor_dtype']}, inv_dtype {k['inv_dtype']}, {k['compute_method']}, symmetry_aware "
             f"{k['symmetry_aware']}"]
    if plan.get("coverage"):
        c = plan["coverage"]
        lines.append(f"coverage: {c['preconditioned']:,} of {c['trainable']:,} trainable parameters preconditioned "
                     f"({c['share']:.1%}; {c['linear_share']:.1%} of the untied linear-like ones)"
                     + "".join(f"; not preconditioned: {t} {n:,}" for t, n in c["heavy_unsupported"].items())
                     + "".join(f"; {note}" for note in c["notes"]))
    lines += ["", "memory per rank (MiB)     busiest rank      mean"]
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
