"""``python -m benchmarks.gpu``: run the chosen parts, each writing ``gpu_<part>.json`` (+ PNG) under ``--out``,
and ``gpu_suite.json``: what ran, how long, ok or the error. Exit 0 when every part is ok, 1 otherwise, 2 for
bad input (no CUDA without ``--cpu-smoke``, no ``--part`` on a GPU)."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

PARTS = ("tests", "defaults", "step_cost", "eigh", "diagnose")
CALL_SECONDS = 540.0  # one device call: 10 minutes at most, 9 planned


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", nargs="+", choices=PARTS, help="parts to run, in this order (required on a GPU; the "
                   "CPU smoke runs all); see benchmarks/README.md 'GPU suite' for one part set per call")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/gpu"),
                   help="folder for the JSON and PNG files (default: $OUT, else runs/gpu)")
    p.add_argument("--cpu-smoke", action="store_true", help="every part's code on the CPU at toy shapes (seconds)")
    p.add_argument("--budget", type=float, default=CALL_SECONDS,
                   help="seconds this call may take; later configurations are skipped to stay inside (default 540)")
    p.add_argument("--select", help="tests: pytest -k expression")
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=["bf16", "fp16"], help="step_cost dtypes")
    p.add_argument("--batches", type=int, nargs="+", default=[128, 96, 64, 48, 32, 16, 8],
                   help="step_cost: micro-batches to probe, the largest that fits is used")
    p.add_argument("--sample-fractions", type=float, nargs="+", help="step_cost: token-sampling fractions, in this "
                   "order (default: 1, then the phase-1 config's; put the lever first when the budget is short)")
    p.add_argument("--pass-fractions", type=float, nargs="+", default=[1.0], help="step_cost: factor_pass_fraction "
                   "values (a lever only with --job-gpus: passes per step > 1)")
    p.add_argument("--compute-methods", nargs="+", default=["eigen"], choices=["eigen", "inverse"],
                   help="step_cost: K-FAC compute_method values")
    p.add_argument("--inv-dtype", choices=["fp32", "bf16", "fp16"], help="step_cost: the decompositions' storage "
                   "dtype (default: the phase-1 config's)")
    p.add_argument("--relative-damping", type=float, help="step_cost: K-FAC's relative damping (the library's mode) "
                   "instead of the absolute 0.001 every earlier figure ran at")
    p.add_argument("--job-gpus", type=int, help="step_cost: time one GPU's optimizer step of a phase-1 job on this "
                   "many GPUs (the config's train_batch_size / (GPUs x micro-batch) accumulated passes); default: "
                   "one micro-batch per step")
    p.add_argument("--repeats", type=int, default=3, help="step_cost and eigh: measured rounds (median reported)")
    p.add_argument("--pieces", nargs="+", choices=["fp16_exact", "effectiveness", "alignment", "profile"],
                   help="diagnose: the pieces to run, in the part's order (default: all)")
    p.add_argument("--cases", nargs="+", help="diagnose: effectiveness cases by name, e.g. inverse_bf16_align-default "
                   "(default: all; names in benchmarks/gpu/diagnose.py EFFECTIVENESS_CASES)")
    p.add_argument("--step-seconds", type=float, nargs="*", help="eigh: LAMB step seconds to size the interval by "
                   "(default: this --out's gpu_step_cost.json)")
    return p


def refuse(message: str) -> int:
    print(f"benchmarks.gpu: {message}", file=sys.stderr)
    return 2


def part_runner(name: str) -> Callable[[Any], dict[str, Any]]:
    from benchmarks.gpu import bert_cost, defaults_part, diagnose, eigh, tests_part

    modules = {"tests": tests_part, "defaults": defaults_part, "step_cost": bert_cost, "eigh": eigh,
               "diagnose": diagnose}
    return modules[name].run  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = build_parser().parse_args(argv)
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        return refuse(f"no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda}): this suite "
                      "measures GPU paths. Run it on a GPU machine (benchmarks/README.md, 'GPU suite'), or pass "
                      "--cpu-smoke for the toy-shape dry run on a CPU.")
    if not args.part and not args.cpu_smoke:
        return refuse(f"name the parts of this call with --part (of {', '.join(PARTS)}): all of them do not fit "
                      "in one 9-minute call")
    parts = args.part or list(PARTS)
    if args.cases:
        from benchmarks.gpu.diagnose import case_names

        unknown = sorted(set(args.cases) - set(case_names()))
        if unknown:
            return refuse(f"--cases: no effectiveness case named {', '.join(unknown)}; the cases are "
                          f"{', '.join(case_names())}")
    from benchmarks.gpu.context import Context
    from benchmarks.harness.machine import machine
    from benchmarks.harness.output import write_json

    args.out.mkdir(parents=True, exist_ok=True)
    ctx = Context(out=args.out, smoke=args.cpu_smoke, args=args, deadline=started + args.budget)
    summary: dict[str, Any] = {"machine": machine(), "argv": sys.argv[1:] if argv is None else argv,
                               "smoke": args.cpu_smoke, "parts": {}}
    for name in parts:
        t0 = time.monotonic()
        print(f"== benchmarks.gpu: part {name} ({ctx.seconds_left():.0f} s left in this call)", flush=True)
        try:
            res = part_runner(name)(ctx)
            entry: dict[str, Any] = {"ok": bool(res.get("ok")), "why": res.get("why")}
        except Exception as exc:  # one broken part must not cost the others their device minutes
            traceback.print_exc()
            entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        entry["seconds"] = time.monotonic() - t0
        summary["parts"][name] = entry
        write_json(summary, args.out / "gpu_suite.json")
        print(f"== part {name}: {'ok' if entry['ok'] else 'NOT OK'} in {entry['seconds']:.0f} s", flush=True)
    return 0 if all(e["ok"] for e in summary["parts"].values()) else 1
