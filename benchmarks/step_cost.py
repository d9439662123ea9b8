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
"""

from __future__ import annotations

import argparse
import copy
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.common import (
    BERT_SIZES,
    KAISA_SKIP,
    bert_for_pretraining,
    machine,
    machine_line,
    median,
    parser,
    pretraining_loss,
    publish,
    random_batch,
    table,
    timed,
)

AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# K-FAC stages of precond.timings that run inside precond.step() (factor capture runs inside forward/backward)
STEP_STAGES = ("factor_reduction", "decomposition", "preconditioning", "gradient_broadcast", "kl_clip", "write_grads")


@dataclass(frozen=True)
class Interval:
    """One decomposition interval: which kinds of step it holds, how many of each, and a step number of each."""

    factor_every: int
    inv_every: int

    def __post_init__(self) -> None:
        if self.factor_every < 1 or self.inv_every < 1 or self.inv_every % self.factor_every:
            raise ValueError(f"--inv-every ({self.inv_every}) must be a positive multiple of --factor-every "
                             f"({self.factor_every})")

    def counts(self) -> dict[str, int]:
        factor_steps = self.inv_every // self.factor_every
        counts = {"decomposition": 1, "factor": factor_steps - 1, "plain": self.inv_every - factor_steps}
        return {kind: n for kind, n in counts.items() if n > 0}

    def step_number(self, kind: str) -> int:
        return {"decomposition": self.inv_every, "factor": self.factor_every, "plain": 1}[kind]


def amortise(kinds: dict[str, dict[str, float]], interval: Interval, baseline_step: float) -> dict[str, Any]:
    """The interval average of every K-FAC cost component and the overhead it makes over a baseline step."""
    counts = interval.counts()
    components = ("hook_extra", *STEP_STAGES, "step_untimed")
    per_step = {c: sum(n * kinds[k][c] for k, n in counts.items()) / interval.inv_every for c in components}
    total = sum(n * kinds[k]["kfac_total"] for k, n in counts.items()) / interval.inv_every
    # K-FAC's own timed work only (hook callbacks + precond.step()): no difference of two forward+backward
    # timings, so machine load moves it far less, but the hooks' bookkeeping outside the callbacks is left out
    stages = sum(n * (kinds[k]["factor_capture"] + kinds[k]["precond_step"])
                 for k, n in counts.items()) / interval.inv_every
    return {"counts": counts, "seconds_per_step": total, "overhead": total / baseline_step,
            "components_seconds_per_step": per_step, "stage_seconds_per_step": stages,
            "stage_overhead": stages / baseline_step}


def build_optimizer(model: torch.nn.Module, *, lr: float) -> tuple[torch.optim.Optimizer, str]:
    """LAMB from kaisa_ds.optim.select with BERT's parameter groups, or AdamW when that module is absent."""
    try:
        from kaisa_ds.optim.select import build_lamb, lamb_param_groups
    except ImportError:
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01), "torch.optim.AdamW"
    opt, name = build_lamb(lamb_param_groups(model, weight_decay=0.01), lr=lr)
    return opt, f"LAMB ({name})"


class SideBySide:
    """A baseline BERT and an identical copy with K-FAC, sharing one batch; times each kind of step."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        from kaisa_ds import KFACPreconditioner

        self.cuda = device.type == "cuda"
        self.autocast = AUTOCAST[args.dtype]
        self.device = device
        self.base = bert_for_pretraining(args.size, vocab=args.vocab, seq=args.seq).to(device)
        self.kmodel = copy.deepcopy(self.base)
        self.opt, self.opt_name = build_optimizer(self.base, lr=args.lr)
        self.batch = random_batch(args.batch, args.seq, args.vocab, device)
        self.interval = Interval(args.factor_every, args.inv_every)
        self.kfac = KFACPreconditioner(
            self.kmodel, factor_update_steps=args.factor_every, inv_update_steps=args.inv_every, damping=0.001,
            kl_clip=0.001, lr=args.lr, skip_layers=KAISA_SKIP, factor_dtype=args.factor_dtype,
            factor_sample_fraction=args.sample_fraction, compute_method=args.compute_method, inv_dtype=args.inv_dtype)
        self.kfac.timer.sync = self.cuda

    def fwd_bwd(self, model: torch.nn.Module) -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.autocast or torch.float32, enabled=self.autocast is not None):
            loss = pretraining_loss(model, self.batch)
        loss.backward()

    @torch.no_grad()
    def _resync_baseline(self) -> None:
        """Undo the optimizer step on the baseline's weights so that both models always compute the same thing."""
        for base, same in zip(self.base.parameters(), self.kmodel.parameters()):
            base.copy_(same)

    def round(self, kinds: list[str]) -> dict[str, dict[str, float]]:
        """One measurement of every kind of step, each next to a baseline forward+backward and optimizer step."""
        out: dict[str, dict[str, float]] = {}
        for kind in kinds:
            base_fb = timed(lambda: self.fwd_bwd(self.base), cuda=self.cuda)
            opt_step = timed(self.opt.step, cuda=self.cuda)
            self._resync_baseline()
            self.kfac.steps = self.interval.step_number(kind)  # the hooks read the step kind during fwd_bwd
            kfac_fb = timed(lambda: self.fwd_bwd(self.kmodel), cuda=self.cuda)
            kfac_step = timed(self.kfac.step, cuda=self.cuda)
            out[kind] = {"baseline_fwd_bwd": base_fb, "optimizer_step": opt_step, "kfac_fwd_bwd": kfac_fb,
                         "precond_step": kfac_step, **self.kfac.timings}
        return out


def summarise(rounds: list[dict[str, dict[str, float]]], agg: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """Aggregate (median or min) every raw timing over the rounds, then derive the K-FAC cost of each kind:
    hook_extra = K-FAC forward+backward - baseline forward+backward; step_untimed = the part of
    ``precond.step()`` outside the named stages (gradient reads, finite check, factor commit)."""
    kinds = list(rounds[0])
    baseline = {c: agg([r[k][c] for r in rounds for k in kinds]) for c in ("baseline_fwd_bwd", "optimizer_step")}
    out: dict[str, Any] = {}
    for kind in kinds:
        row = {c: agg([r[kind][c] for r in rounds]) for c in rounds[0][kind] if c not in baseline}
        row["hook_extra"] = row["kfac_fwd_bwd"] - baseline["baseline_fwd_bwd"]
        row["step_untimed"] = row["precond_step"] - sum(row[s] for s in STEP_STAGES)
        row["kfac_total"] = row["hook_extra"] + row["precond_step"]
        out[kind] = row
    return baseline, out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    info = machine()
    run = SideBySide(args, device)
    kinds = list(run.interval.counts())
    for _ in range(args.warmup):  # allocations, optimizer state, K-FAC structure and first decompositions
        run.round(kinds)
    rounds = [run.round(kinds) for _ in tqdm(range(args.repeats), desc="step_cost rounds", leave=False)]
    if run.kfac.skipped_windows:
        raise RuntimeError(f"K-FAC dropped {run.kfac.skipped_windows} window(s) for non-finite values "
                           f"({args.dtype}): the timings would not be those of real steps")
    baseline, med = summarise(rounds, median)
    best_baseline, best = summarise(rounds, min)
    step_s = baseline["baseline_fwd_bwd"] + baseline["optimizer_step"]
    res: dict[str, Any] = {
        "machine": info, "settings": {**vars(args), "out": str(args.out), "optimizer": run.opt_name,
                                           "device": str(device), "kfac_layers": len(run.kfac.layers),
                                           "kfac_factors": len(run.kfac.factors())},
        "baseline": {"fwd_bwd_s": baseline["baseline_fwd_bwd"], "optimizer_step_s": baseline["optimizer_step"],
                     "step_s": step_s},
        "step_kinds": med, "amortised": amortise(med, run.interval, step_s),
        # the same from each timing's fastest round: an estimate less exposed to other work on a shared machine
        "amortised_from_minima": amortise(best, run.interval, best_baseline["baseline_fwd_bwd"]
                                          + best_baseline["optimizer_step"]),
        "rounds": rounds, "load_average_1m_after": os.getloadavg()[0],
        "decompositions": decomposition_times(args.decomp_sizes, device, repeats=args.decomp_repeats),
    }
    res["calibration"] = calibration(res, args, device)
    return res


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
    x = torch.randn(rows, n, device=device, dtype=AUTOCAST[dtype] or torch.float32)
    x.t() @ x  # untimed: workspace
    seconds = median([timed(lambda: x.t() @ x, cuda=cuda) for _ in range(repeats)])
    return 2.0 * rows * n * n / seconds / 1e9


def calibration(res: dict[str, Any], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The rates ``python -m kaisa_ds.plan --calibration`` reads: GEMM GFLOP/s, eigh and inverse seconds per
    factor size, and the measured baseline step with the settings it belongs to."""
    hidden = BERT_SIZES[args.size][0]
    return {"gemm_gflops": gemm_gflops(device, args.dtype, rows=args.batch * args.seq, n=hidden),
            "eigh_seconds": {str(d["size"]): d["eigh_fp32_s"] for d in res["decompositions"]},
            "inverse_seconds": {str(d["size"]): d["inverse_fp32_s"] for d in res["decompositions"]},
            "baseline_step_s": res["baseline"]["step_s"],
            "settings": {"model": args.size, "micro_batch": args.batch, "seq": args.seq},
            "device": str(device), "dtype": args.dtype}


def report(res: dict[str, Any]) -> str:
    """The printed tables: per step kind, the amortised breakdown, the decompositions."""
    s = res["settings"]
    kinds = res["step_kinds"]
    counts = res["amortised"]["counts"]
    lines = [f"BERT-{s['size']} {s['dtype']} batch {s['batch']}x{s['seq']} on {s['device']}, "
             f"optimizer {s['optimizer']}, "
             f"{s['kfac_layers']} K-FAC layers; factors every {s['factor_every']}, decompositions every "
             f"{s['inv_every']} steps, {s.get('compute_method', 'eigen')} method, "
             f"inv_dtype {s.get('inv_dtype', 'fp32')}, factor_sample_fraction {s.get('sample_fraction', 1.0)}; "
             f"medians of {s['repeats']} rounds", machine_line(res["machine"]), ""]
    rows = [{"what": "baseline forward+backward", **{k: res["baseline"]["fwd_bwd_s"] for k in kinds}},
            {"what": "optimizer step", **{k: res["baseline"]["optimizer_step_s"] for k in kinds}}]
    for comp in ("kfac_fwd_bwd", "hook_extra", "factor_capture", *STEP_STAGES, "step_untimed", "precond_step",
                 "kfac_total"):
        rows.append({"what": comp, **{k: v[comp] for k, v in kinds.items()}})
    rows.append({"what": "steps of this kind per interval", **counts})
    lines += [table(rows, ["what", *kinds]), ""]
    am = res["amortised"]
    per = am["components_seconds_per_step"]
    total = am["seconds_per_step"]
    lines.append(table([{"component": c, "s/step": v, "share": f"{100 * v / total:.1f}%" if total else ""}
                        for c, v in sorted(per.items(), key=lambda kv: -kv[1])], ["component", "s/step", "share"]))
    lines.append(f"\namortised K-FAC time {total:.4g} s/step over a {s['inv_every']}-step interval = "
                 f"{100 * am['overhead']:.1f}% of a baseline step ({res['baseline']['step_s']:.4g} s: forward+backward "
                 f"+ {s['optimizer']} step)")
    if any(v["kfac_total"] < 0 for v in kinds.values()):
        lines.append("WARNING: a step kind costs less with K-FAC than without: timing noise exceeds the effect here "
                     "(other work on this machine?); rerun with more --repeats, or --threads 1 on a busy machine")
    lines.append(f"from K-FAC's own timed work (hook callbacks + precond.step(), no forward+backward difference): "
                 f"{am['stage_seconds_per_step']:.4g} s/step = {100 * am['stage_overhead']:.1f}%")
    best = res["amortised_from_minima"]
    lines.append(f"from each timing's fastest round instead of its median: {best['seconds_per_step']:.4g} s/step = "
                 f"{100 * best['overhead']:.1f}% (load average {res['machine']['load_average_1m']:.1f} before, "
                 f"{res['load_average_1m_after']:.1f} after)\n")
    if res["decompositions"]:
        lines.append(table(res["decompositions"], ["size", "repeats", "eigh_fp32_s", "inverse_fp32_s"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("step_cost", __doc__)
    p.add_argument("--size", default="mini", choices=list(BERT_SIZES), help="BERT size (default: %(default)s)")
    p.add_argument("--dtype", default="fp32", choices=list(AUTOCAST), help="autocast dtype (fp16: GPU only)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--lr", type=float, default=1e-3, help="optimizer lr, also K-FAC's lr for the KL clip")
    p.add_argument("--factor-every", type=int, default=5, help="factor_update_steps (default: %(default)s)")
    p.add_argument("--inv-every", type=int, default=50, help="inv_update_steps (default: %(default)s)")
    p.add_argument("--factor-dtype", default=None, choices=["fp32", "fp16", "bf16"], help="factor storage dtype")
    p.add_argument("--sample-fraction", type=float, default=1.0,
                   help="factor_sample_fraction: share of tokens feeding the factor statistics (default 1: all)")
    p.add_argument("--compute-method", default="eigen", choices=["eigen", "inverse"], help="K-FAC compute_method")
    p.add_argument("--inv-dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="K-FAC inv_dtype: decompositions stored and applied in this dtype (default fp32)")
    p.add_argument("--repeats", type=int, default=7, help="measured rounds; medians are reported")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own choice, one per core)")
    p.add_argument("--decomp-sizes", type=int, nargs="*", default=[256, 1024, 4096],
                   help="factor sizes for the eigh/inverse timings (none: skip)")
    p.add_argument("--decomp-repeats", type=int, default=3, help="repeats per size (1 for sizes > 2048 on CPU)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1 and --warmup >= 0")
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
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
