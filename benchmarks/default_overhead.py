"""What ``"kfac": {"enabled": true}`` adds to a training step, measured the way a user meets it: two copies of one BERT
train side by side on the same batches, steps alternating, one optimizer in both (plain SGD, or LAMB), one with
K-FAC at every default
(``KFACPreconditioner(model)``: the statistics, the decomposition interval and its cost rule, the method, all as
shipped). The overhead is the K-FAC copy's mean step time over the baseline's, over the steps after the cost rule has
set the interval, timing the K-FAC copy's own steps alone as a real run would (the steady state); the K-FAC stages'
seconds per step say where it goes.

    python -m benchmarks.default_overhead                        # BERT-mini, 64 x 128 tokens, 150 steady steps
    python -m benchmarks.default_overhead --size tiny --batch 32 --seq 64 --steps 40   # a quick look
    python -m benchmarks.default_overhead --size base --batch 256 --dtype bf16 --optimizer lamb --device cuda
    python -m benchmarks.default_overhead --size mini --batch 32 --seq 64 --optimizer lamb --kfac-set max_factor_ratio=2

``--kfac-set`` changes the K-FAC copy's options (a candidate default's cost against the same baseline).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.convergence.defaults import kfac_setting
from benchmarks.harness.batches import random_batch
from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.models import bert_for_pretraining, fwd_bwd
from benchmarks.harness.output import publish, table
from benchmarks.harness.timing import timed
from kaisa_ds import KFACPreconditioner
from kaisa_ds.optim.select import build_lamb
from kaisa_ds.step import STAGES


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                precond: KFACPreconditioner | None, *, autocast: torch.dtype | None) -> float:
    """One step's wall seconds (on a GPU the queue drained around it: the next step's timer starts on an idle
    device)."""
    def step() -> None:
        fwd_bwd(model, batch, autocast=autocast)
        if precond is not None:
            precond.step()
        opt.step()

    return timed(step, cuda=next(model.parameters()).is_cuda)


def _optimizer(name: str, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    if name == "lamb":
        return build_lamb(list(model.parameters()), lr=lr, weight_decay=0.01)[0]
    return torch.optim.SGD(model.parameters(), lr=lr)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batches = [random_batch(args.batch, args.seq, 30522, device, seed=i) for i in range(8)]
    base, kfac_model = (bert_for_pretraining(args.size, seq=args.seq, seed=0).to(device) for _ in range(2))
    precond = KFACPreconditioner(kfac_model, **dict(args.kfac_set))
    opts = [_optimizer(args.optimizer, m, args.lr) for m in (base, kfac_model)]
    autocast = {"fp32": None, "bf16": torch.bfloat16}[args.dtype]
    times: dict[str, list[float]] = {"baseline": [], "kfac": []}
    stages: list[dict[str, float]] = []
    # warm-up: the K-FAC copy alone, as in a real run, until the cost rule has timed its own steps and set the interval
    warmup = 0
    for warmup in tqdm(range(args.warmup_limit), desc="warm-up (K-FAC alone)", unit="step"):
        _train_step(kfac_model, opts[1], batches[warmup % len(batches)], precond, autocast=autocast)
        if precond.cost_interval is not None:
            break
    _train_step(base, opts[0], batches[0], None, autocast=autocast)  # the baseline's first step is not measured
    steady_from = precond.steps
    for step in tqdm(range(args.steps), desc="steady (side by side)", unit="step"):
        batch = batches[step % len(batches)]
        order = ("baseline", "kfac") if step % 2 == 0 else ("kfac", "baseline")  # alternate which runs first
        for name in order:
            model, opt = (base, opts[0]) if name == "baseline" else (kfac_model, opts[1])
            times[name].append(_train_step(model, opt, batch, precond if name == "kfac" else None,
                                           autocast=autocast))
        stages.append(dict(precond.timings))
    mean = {k: sum(v) / len(v) for k, v in times.items()}
    per_stage = {s: sum(st[s] for st in stages) / len(stages) for s in STAGES}
    capture = per_stage["factor_capture"]
    return {
        "machine": machine(), "settings": vars(args), "steady_from_step": steady_from, "warmup_steps": warmup + 1,
        "inv_update_steps": precond.inv_update_steps(), "cost_interval": precond.cost_interval,
        "statistic_rows": precond.statistic_rows, "steady_steps": len(times["kfac"]),
        "baseline_step_s": mean["baseline"], "kfac_step_s": mean["kfac"],
        "overhead": mean["kfac"] / mean["baseline"] - 1.0,
        "stage_share_of_baseline": {s: v / mean["baseline"] for s, v in per_stage.items()},
        "hooks_share_of_baseline": capture / mean["baseline"],
        "coverage": precond.coverage.summary()["share"], "compute_method": precond.config.method_on(device).value,
    }


def report(res: dict[str, Any]) -> str:
    s = res["settings"]
    head = (f"BERT-{s['size']} {s['batch']}x{s['seq']} {s['dtype']} on {s['device']}, {s['optimizer']}, K-FAC at every "
            f"default ({res['compute_method']}); {res['steady_steps']} "
            f"steady steps from step {res['steady_from_step']} (decompositions every {res['inv_update_steps']} "
            f"steps, cost rule {res['cost_interval']}, {res['statistic_rows']} statistic rows per update)")
    rows = [{"what": "baseline step (s)", "value": res["baseline_step_s"]},
            {"what": "K-FAC step (s)", "value": res["kfac_step_s"]},
            {"what": "K-FAC adds (share of the baseline step)", "value": res["overhead"]}]
    rows += [{"what": f"  {k} (share)", "value": v} for k, v in res["stage_share_of_baseline"].items()]
    return "\n".join([head, machine_line(res["machine"]), "", table(rows, ["what", "value"])])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("default_overhead", __doc__)
    p.add_argument("--size", default="mini")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=150, help="steady steps measured per copy")
    p.add_argument("--warmup-limit", type=int, default=60, help="steps to wait at most for the cost rule")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="autocast dtype of the forward pass")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "lamb"],
                   help="both copies' optimizer: plain SGD (the CPU target's), or LAMB (the GPU targets')")
    p.add_argument("--kfac-set", metavar="KEY=VALUE", nargs="+", default=[], type=kfac_setting,
                   help="K-FAC options of the K-FAC copy (default: none, every default)")
    args = p.parse_args(argv)
    res = measure(args)
    publish(res, report(res), args.out)
    return res


if __name__ == "__main__":
    main()
