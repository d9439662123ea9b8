"""Overlapped factor reduction on 2 gloo ranks: time inside ``step()`` spent on factor reduction, before/after.

Both variants run side by side in one launch (same spawned ranks, alternating rounds): BERT (``--size``) with
factors every step and no decomposition after the first step, so ``step()``'s ``factor_reduction`` stage is the
all-reduce of every factor. ``synchronous``: ``overlap_factor_reduction=False`` (everything reduced inside
``step()``); ``overlapped``: buckets start from the backward hooks of the last pass and ``step()`` only waits.
Per variant, medians over ``--rounds``: forward+backward seconds (hooks included), the seconds the hooks spent
starting buckets, ``step()``'s factor_reduction stage, and the whole ``step()``.

    python -m benchmarks.overlap --size mini --rounds 10 --bucket-mb 4
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.harness.batches import random_batch
from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from benchmarks.harness.output import publish, table
from benchmarks.harness.processes import spawn
from benchmarks.harness.timing import median, timed
from kaisa_ds.plan.bert_sizes import KAISA_SKIP


def _backward(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> None:
    pretraining_loss(model, batch).backward()


def _rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, dict[str, float]]:
    from kaisa_ds import KFACPreconditioner

    torch.set_num_threads(1)
    runs = {}
    for overlap in (False, True):
        model = bert_for_pretraining(cfg["size"], seq=cfg["seq"])
        kfac = KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=10**6, skip_layers=KAISA_SKIP,
                                  factor_dtype=cfg["factor_dtype"], overlap_factor_reduction=overlap,
                                  accumulation_steps=1, allreduce_bucket_cap_mb=cfg["bucket_mb"], kl_clip=0.001,
                                  lr=0.01)
        runs["overlapped" if overlap else "synchronous"] = (model, kfac)
    batch = random_batch(cfg["batch"], cfg["seq"], 30522, "cpu", seed=rank)
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in runs}
    for i in range(cfg["rounds"] + 1):  # round 0 builds the structure (always synchronous): not counted
        for name, (model, kfac) in runs.items():
            model.zero_grad(set_to_none=True)
            dist.barrier()
            fwd_bwd = timed(partial(_backward, model, batch), cuda=False)
            launch = kfac.window_reducer().launch_seconds if kfac.structure is not None else 0.0
            for p in model.parameters():  # gradients averaged as DDP would (not timed)
                if p.grad is not None:
                    dist.all_reduce(p.grad)
            step = timed(kfac.step, cuda=False)
            kfac.window_reducer().launch_seconds = 0.0
            if i:
                samples[name].append({"fwd_bwd_s": fwd_bwd, "hook_launch_s": launch,
                                      "step_factor_reduction_s": kfac.timings["factor_reduction"], "step_s": step})
    return {k: {m: median([s[m] for s in v]) for m in v[0]} for k, v in samples.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("overlap", __doc__)
    p.add_argument("--size", default="mini")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--bucket-mb", type=float, default=4.0, help="allreduce_bucket_cap_mb (default: %(default)s)")
    p.add_argument("--dtypes", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16", "bf16"])
    args = p.parse_args(argv)
    rows = []
    for dtype in args.dtypes:
        cfg = {"size": args.size, "batch": args.batch, "seq": args.seq, "rounds": args.rounds,
               "bucket_mb": args.bucket_mb, "factor_dtype": dtype}
        per_rank = spawn(_rank, 2, cfg)
        for variant in ("synchronous", "overlapped"):
            row = {"factor_dtype": dtype, "variant": variant}
            for metric in per_rank[0][variant]:
                row[metric] = max(r[variant][metric] for r in per_rank)  # the slower rank sets the pace
            rows.append(row)
    info = machine()
    text = (f"Overlapped factor reduction, BERT-{args.size}, 2 gloo ranks, micro-batch {args.batch}x{args.seq}, "
            f"buckets of {args.bucket_mb} MB, medians of {args.rounds} rounds (slower rank)\n{machine_line(info)}\n\n"
            + table(rows, ["factor_dtype", "variant", "fwd_bwd_s", "hook_launch_s", "step_factor_reduction_s",
                           "step_s"]))
    res = {"machine": info, "settings": {**vars(args), "out": str(args.out)}, "rows": rows}
    publish(res, text, args.out)
    return res


if __name__ == "__main__":
    main()
