"""Step cost of K-FAC on BERT: forward+backward, optimizer step, every K-FAC stage, and the amortised overhead.

A baseline model (no K-FAC hooks) and an identical K-FAC model run side by side, round after round, on the same
batch. In a decomposition interval of ``--inv-every`` steps with factors every ``--factor-every`` steps there are
three kinds of K-FAC step:
  decomposition  1 per interval: hooks capture statistics, factors all-reduced, every decomposition recomputed;
  factor         inv/factor - 1: hooks capture statistics, factors all-reduced and committed;
  plain          inv - inv/factor: only the cached decompositions are applied.
Each kind is measured for real (the K-FAC step counter is set to a step of that kind), and the interval average
is computed exactly from those counts, so nothing is extrapolated from a shortened interval. The K-FAC time of a
kind = its forward+backward with hooks minus the baseline's forward+backward (the hooks' extra cost) + the wall
time of ``precond.step()``, each the median of ``--repeats`` rounds (the fastest rounds give a second estimate).
The amortised overhead is the interval average of that time divided by the baseline's forward+backward + optimizer
step (LAMB from kaisa_ds.optim.select when it exists, else AdamW). Also times one FP32 eigendecomposition and one
damped inverse per factor size (``--decomp-sizes``), and the GEMM rate of the statistics: the JSON's ``calibration``
object, which ``python -m kaisa_ds.plan --calibration FILE`` reads to predict the overhead of other runs.

    python -m benchmarks.step_cost                          # BERT-mini, batch 32 x 128, fp32 (2-6 min on 2 cores)
    python -m benchmarks.step_cost --threads 1              # the same on a busy shared CPU (see README.md)
    python -m benchmarks.step_cost --size tiny --batch 8 --seq 64 --repeats 2 --decomp-sizes 256
    python -m benchmarks.step_cost --size large --dtype bf16 --decomp-sizes 256 1024 4096   # on a GPU
    python -m benchmarks.step_cost --accumulation 8 --pass-fraction 0.25   # steps of 8 accumulated passes
    python -m benchmarks.step_cost --grafting gradient      # the library's default step (KAISA's: --grafting none)
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.harness.cli import add_side_by_side_flags, check_side_by_side_flags, parser
from benchmarks.harness.options import DTYPE_NAMES
from benchmarks.harness.output import publish
from benchmarks.step_cost.measure import measure
from benchmarks.step_cost.report import report
from kaisa_ds.enums import ComputeMethod, Grafting


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("step_cost", __doc__)
    add_side_by_side_flags(p, help_for={"--lr": "optimizer lr, also K-FAC's lr for the KL clip"})
    p.add_argument("--dtype", default="fp32", choices=list(DTYPE_NAMES), help="autocast dtype (fp16: GPU only)")
    p.add_argument("--factor-dtype", default=None, choices=list(DTYPE_NAMES), help="factor storage dtype")
    p.add_argument("--compute-method", type=ComputeMethod, default=ComputeMethod.EIGEN,
                   choices=[m.value for m in ComputeMethod], help="K-FAC compute_method")
    p.add_argument("--accumulation", type=int, default=1, help="forward+backward passes per optimizer step "
                   "(gradient accumulation; DeepSpeed's gradient_accumulation_steps); both models run them all")
    p.add_argument("--pass-fraction", type=float, default=1.0, help="K-FAC factor_pass_fraction: share of a factor "
                   "step's passes whose statistics feed the factors (needs --accumulation > 1 to matter)")
    p.add_argument("--grafting", type=Grafting, default=Grafting.NONE, choices=[g.value for g in Grafting],
                   help="K-FAC's grafting: 'none' (default) is KAISA's step with its KL clip 0.001, as every earlier "
                        "figure; 'gradient' is the library's default since 2026-11-28 (each layer's step at its raw "
                        "gradient's size, no KL clip)")
    p.add_argument("--damping", type=float, help="K-FAC's absolute damping (default: 0.001, as every earlier figure)")
    p.add_argument("--relative-damping", type=float, help="K-FAC's relative damping instead (the library's mode)")
    p.add_argument("--decomp-sizes", type=int, nargs="*", default=[256, 1024, 4096],
                   help="factor sizes for the eigh/inverse timings (none: skip)")
    p.add_argument("--decomp-repeats", type=int, default=3, help="repeats per size (1 for sizes > 2048 on CPU)")
    args = p.parse_args(argv)
    check_side_by_side_flags(p, args)
    if args.accumulation < 1 or not 0.0 < args.pass_fraction <= 1.0:
        p.error("--accumulation must be >= 1 and --pass-fraction in (0, 1]")
    if args.dtype == "fp16" and not args.device.startswith("cuda"):
        p.error("--dtype fp16 needs a GPU (fp16 autocast without a loss scaler is no CPU training setting); "
                "use --dtype bf16 on a CPU")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    res = measure(args)
    publish(res, report(res), args.out)
    return res


if __name__ == "__main__":
    main()
