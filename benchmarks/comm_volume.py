"""Bytes each rank sends per step under MEM-OPT, HYBRID-OPT and COMM-OPT, checked against KAISA's formulas.

Payloads (what a rank hands to a collective; a ring all-reduce moves about 2(W-1)/W of it per rank):
  factor all-reduce (factor-update steps): Σ_f |F_f| per rank, |F| = n² (n(n+1)/2 symmetry-aware, n if diagonal),
      plus one count per factor;
  decomposition broadcast (decomposition steps): Σ_f |D_f| in total, sent by each factor's inverse worker,
      |D| = n² + n + 1 (eigenvectors, eigenvalues, validity flag; n + 1 if diagonal), and 0 when a layer has a
      single gradient worker (MEM-OPT);
  gradient broadcast (every step): Σ_l g·|∇_l| in total, with g = world · grad_worker_fraction gradient workers each
      sending to its receiver group, and 0 when g = world (COMM-OPT).
The benchmark fails (exit 1) when a measured total differs from the formula.

    python -m benchmarks.comm_volume --worlds 2 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    KAISA_SKIP,
    RESULTS,
    bert_for_pretraining,
    machine,
    pretraining_loss,
    random_batch,
    spawn,
    table,
    write_json,
)

STRATEGIES = {"MEM-OPT": "mem-opt", "HYBRID-OPT": 0.5, "COMM-OPT": "comm-opt"}


def _measure(rank: int, world: int, fraction: Any, symmetric: bool, size: str) -> dict[str, Any]:
    from kaisa_ds import KFACPreconditioner

    model = bert_for_pretraining(size, vocab=1000, seq=32)
    kfac = KFACPreconditioner(model, factor_update_steps=2, inv_update_steps=2, grad_worker_fraction=fraction,
                              symmetry_aware=symmetric, skip_layers=KAISA_SKIP, kl_clip=0.001)
    batch = random_batch(4, 32, 1000, torch.device("cpu"))
    per_step = []
    for _ in range(2):  # step 0: factors + decompositions; step 1: neither
        before = {**kfac.comm_bytes, **(kfac._comm.bytes_sent if kfac._comm else {})}
        model.zero_grad()
        pretraining_loss(model, *batch).backward()
        for p in model.parameters():
            if p.grad is not None:
                torch.distributed.all_reduce(p.grad)
                p.grad /= world
        kfac.step()
        after = {**kfac.comm_bytes, **(kfac._comm.bytes_sent if kfac._comm else {})}
        per_step.append({k: after.get(k, 0) - before.get(k, 0) for k in after})
    factors = [(f.dim, f.diagonal) for f in kfac.factors().values()]
    grads = [ly.g.dim * ly.a.dim for ly in kfac.layers.values()]
    return {"per_step": per_step, "factors": factors, "grads": grads, "grad_workers": kfac.grad_workers}


def formulas(factors: list[tuple[int, bool]], grads: list[int], *, world: int, grad_workers: int,
             symmetric: bool) -> dict[str, int]:
    def factor_payload(n: int, diag: bool) -> int:
        return n if diag else (n * (n + 1) // 2 if symmetric else n * n)

    allreduce = 4 * (sum(factor_payload(n, d) for n, d in factors) + len(factors))
    decomposition = 4 * sum((n + 1) if d else (n * n + n + 1) for n, d in factors) if grad_workers > 1 else 0
    gradient = 4 * grad_workers * sum(grads) if grad_workers < world else 0
    return {"factor_allreduce_per_rank": allreduce, "decomposition_broadcast_total": decomposition,
            "gradient_broadcast_total": gradient}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.comm_volume", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--size", default="tiny", choices=["tiny", "mini"])
    p.add_argument("--out", type=Path, default=RESULTS / "comm_volume.json")
    args = p.parse_args(argv)
    rows, mismatches = [], []
    for world in args.worlds:
        for name, fraction in STRATEGIES.items():
            for symmetric in (False, True):
                ranks = spawn(_measure, world, fraction, symmetric, args.size)
                gw = ranks[0]["grad_workers"]
                want = formulas(ranks[0]["factors"], ranks[0]["grads"], world=world, grad_workers=gw,
                                symmetric=symmetric)
                got = {
                    "factor_allreduce_per_rank": ranks[0]["per_step"][0].get("factor_allreduce", 0),
                    "decomposition_broadcast_total": sum(r["per_step"][0].get("decomposition_broadcast", 0)
                                                         for r in ranks),
                    "gradient_broadcast_total": sum(r["per_step"][1].get("gradient_broadcast", 0) for r in ranks),
                }
                quiet = sum(r["per_step"][1].get(k, 0) for r in ranks
                            for k in ("factor_allreduce", "decomposition_broadcast"))
                per_rank_update = [sum(r["per_step"][0].values()) for r in ranks]
                per_rank_other = [sum(r["per_step"][1].values()) for r in ranks]
                row = {"world": world, "strategy": name, "grad_workers": gw, "symmetric": symmetric,
                       "update step MB/rank (max)": max(per_rank_update) / 2**20,
                       "other step MB/rank (max)": max(per_rank_other) / 2**20,
                       "ring all-reduce MB/rank": got["factor_allreduce_per_rank"] * 2 * (world - 1) / world / 2**20}
                for key in want:
                    row[f"{key} measured"] = got[key]
                    row[f"{key} formula"] = want[key]
                    if abs(got[key] - want[key]) > 0.01 * max(want[key], 1):
                        mismatches.append(f"world {world} {name} symmetric={symmetric} {key}: "
                                          f"measured {got[key]} vs formula {want[key]}")
                if quiet:
                    mismatches.append(f"world {world} {name}: {quiet} bytes of factor traffic on a non-update step")
                rows.append(row)
    print(table(rows, ["world", "strategy", "grad_workers", "symmetric", "update step MB/rank (max)",
                       "other step MB/rank (max)", "ring all-reduce MB/rank"]))
    print()
    print(table(rows, ["world", "strategy", "symmetric"] + [k for k in rows[0] if k.endswith(("measured", "formula"))]))
    write_json({"machine": machine(), "settings": vars(args), "rows": rows, "mismatches": mismatches}, args.out)
    print(f"\nwrote {args.out}")
    if mismatches:
        print("MISMATCHES:\n" + "\n".join(mismatches))
        sys.exit(1)
    print("every measured volume matches its formula")
    return {"rows": rows}


if __name__ == "__main__":
    main()
