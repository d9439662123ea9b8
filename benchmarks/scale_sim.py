"""Simulated scale: KAISA's memory, traffic and decomposition balance at 64-1024 ranks, BERT-Large shapes.

No rank is started and no weight allocated: BERT-Large's K-FAC layers come from the planner (the model on the
``meta`` device through kaisa_ds's own hooks), and the real ``assign_work`` (the longest-job-first assignment
and the KAISA grid the process groups are built from) runs for every world size and strategy. The planner's
memory and traffic formulas are checked against measured runs at worlds 2 and 4 (tests/kaisa_ds/plan).
Reported per strategy and world: K-FAC bytes on the busiest rank, payload per rank of each kind of step (the
busiest rank), amortised over the intervals, and the decomposition imbalance (max/mean n³ work per rank)
beside its bound (max(largest single decomposition, total/world) / mean). HYBRID-OPT is grad_worker_fraction
1/2 (``hybrid-opt``). The K-FAC settings default to the shipped BERT-Large config's
(ds_configs/bert_large_fp16_phase1_kfac.json: fp16 factors, bf16 decompositions, symmetric packing, factors
every 5 and decompositions every 50 steps).

    python -m benchmarks.scale_sim                       # worlds 64, 256, 1024
    python -m benchmarks.scale_sim --worlds 8 16 --size base
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.memory import MB
from benchmarks.harness.options import STRATEGIES
from benchmarks.harness.output import publish, table
from kaisa_ds.config import KFACConfig
from kaisa_ds.plan.bert_sizes import KAISA_SKIP, SIZES
from kaisa_ds.plan.shapes import model_shapes
from kaisa_ds.plan.summary import make_plan


def simulate(*, size: str, worlds: list[int], micro_batch: int, seq: int, options: dict[str, Any]) -> list[dict]:
    """One row per (world, strategy): the planner's figures for the real assignment at that world."""
    rows = []
    for name, fraction in STRATEGIES.items():
        config = KFACConfig(**{**options, "grad_worker_fraction": fraction})
        shapes, _ = model_shapes(size, config, seq=seq)
        for world in worlds:
            start = time.perf_counter()
            plan = make_plan(shapes, config, world=world, micro_batch=micro_batch, seq=seq)
            traffic = plan["traffic"]
            payload = traffic["payload_bytes_per_rank"]
            rows.append({
                "world": world, "strategy": name, "grad_workers": plan["grad_workers"],
                "kfac_MB_per_rank_max": plan["memory_bytes_per_rank"] / MB,
                "decompositions_MB_max": plan["memory_bytes"]["max_rank"]["decompositions"] / MB,
                **{f"{kind}_step_MB_max": payload[kind]["total"]["max"] / MB for kind in payload},
                "amortised_MB_per_step_mean": traffic["amortised_bytes_per_rank"]["total"]["mean"] / MB,
                "imbalance": plan["decomposition_imbalance"], "bound": plan["decomposition_imbalance_bound"],
                "imbalance_over_bound": plan["decomposition_imbalance"] / plan["decomposition_imbalance_bound"],
                "seconds": time.perf_counter() - start, "plan": {k: v for k, v in plan.items() if k != "memory_bytes"},
            })
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("scale_sim", __doc__)
    p.add_argument("--size", default="large", choices=list(SIZES), help="BERT size (default: %(default)s)")
    p.add_argument("--worlds", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--factor-dtype", default="fp16")
    p.add_argument("--inv-dtype", default="bf16")
    p.add_argument("--factor-every", type=int, default=5)
    p.add_argument("--inv-every", type=int, default=50)
    args = p.parse_args(argv)
    options = {"factor_dtype": args.factor_dtype, "inv_dtype": args.inv_dtype, "symmetry_aware": True,
               "factor_update_steps": args.factor_every, "inv_update_steps": args.inv_every,
               "skip_layers": list(KAISA_SKIP)}
    rows = simulate(size=args.size, worlds=args.worlds, micro_batch=args.micro_batch, seq=args.seq, options=options)
    info = machine()
    kinds = [k for k in rows[0] if k.endswith("_step_MB_max")]
    text = (f"Simulated KAISA at scale, BERT-{args.size} K-FAC shapes ({rows[0]['plan']['layers']} layers, "
            f"{rows[0]['plan']['factors']} factors), micro-batch {args.micro_batch}x{args.seq}, factor_dtype "
            f"{args.factor_dtype}, inv_dtype {args.inv_dtype}, symmetric packing, factors every {args.factor_every} / "
            f"decompositions every {args.inv_every} steps; HYBRID-OPT = grad_worker_fraction 1/2\n"
            f"{machine_line(info)}\n\n"
            + table(rows, ["world", "strategy", "grad_workers", "kfac_MB_per_rank_max", "decompositions_MB_max",
                           *kinds, "amortised_MB_per_step_mean", "imbalance", "bound", "imbalance_over_bound"]))
    res = {"machine": info, "settings": {**vars(args), "out": str(args.out)}, "rows": rows}
    publish(res, text, args.out)
    return res


if __name__ == "__main__":
    main()
