"""K-FAC memory against accumulation passes, factor storage dtype and grad_worker_fraction (MEM/HYBRID/COMM-OPT).

Every configuration runs in fresh spawned processes (gloo ranks, one torch thread each) so that peak figures
start clean. Each runs a BERT (``--size``, K-FAC on the encoder only, KAISA's skip list) for one baseline step
without K-FAC, then two K-FAC steps with factors and decompositions every step, each step made of ``passes``
forward/backward passes of a fixed micro-batch before ``precond.step()``. Recorded per rank:
  factors stored   the running averages (``factor_dtype``), from ``precond.memory_usage()`` after a step;
  window buffer    the open accumulation buffer of a factor-update window (memory_usage before the step
                   minus after the previous one): one per factor, however many passes fill it; FP32 for FP32
                   factors, the packed upper triangle in FP16/BF16 for half-precision factors;
  decompositions   eigenvectors and eigenvalues this rank holds (in ``inv_dtype``, ``--inv-dtypes``);
  peak delta       how far K-FAC raised the process's peak memory above the baseline step's peak
                   (``ru_maxrss`` on CPU, ``torch.cuda.max_memory_allocated`` on a GPU): it adds the statistics'
                   temporaries and the allocator's slack to the three figures above.
Also counted: factors whose stored average is entirely zero and factors left without a decomposition (a
storage dtype too narrow for the statistics: FP16 flushes the tiny G second moments to zero).
Expected: every K-FAC figure flat in the number of passes; FP16/BF16 storage halves the stored factors and
quarters the window buffer; decompositions per rank shrink from COMM-OPT (every rank holds all) to MEM-OPT
(about 1/world each), while every rank keeps all factors.

    python -m benchmarks.memory                        # BERT-mini, micro-batch 4 x 128, worlds 2 and 4
    python -m benchmarks.memory --size tiny --passes 1 2 --dtypes fp32 fp16 --worlds 2
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from benchmarks.harness.batches import random_batch
from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.memory import MB, peak_bytes, peak_source
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from benchmarks.harness.output import table, write_json
from benchmarks.harness.processes import isolated, spawn
from kaisa_ds.plan.bert_sizes import KAISA_SKIP, SIZES
from kaisa_ds.plan.summary import strategy_name


def _measure(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of one configuration: baseline step, then two K-FAC steps; K-FAC bytes and the peak delta."""
    from kaisa_ds import KFACPreconditioner

    device = torch.device(cfg["device"] if world == 1 else "cpu")
    model = bert_for_pretraining(cfg["size"], vocab=cfg["vocab"], seq=cfg["seq"]).to(device)
    batches = [random_batch(cfg["batch"], cfg["seq"], cfg["vocab"], device, seed=1000 * rank + i)
               for i in range(cfg["passes"])]

    def accumulate() -> None:
        model.zero_grad(set_to_none=True)
        for batch in batches:  # the loss is averaged over the passes, as with gradient accumulation
            (pretraining_loss(model, batch) / len(batches)).backward()
        if world > 1:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world

    accumulate()
    base_peak = peak_bytes(device)
    kfac = KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=1, grad_worker_fraction=cfg["fraction"],
                              factor_dtype=cfg["factor_dtype"], inv_dtype=cfg["inv_dtype"],
                              skip_layers=KAISA_SKIP, kl_clip=0.001, lr=0.01)
    stored, window = 0, 0
    for _ in range(2):  # the second step is the steady state (the first also discovers shared inputs)
        accumulate()
        window = kfac.memory_usage()["factors"] - stored  # stored averages + this window's FP32 buffer
        kfac.step()
        stored = kfac.memory_usage()["factors"]
    usage = kfac.memory_usage()
    assert kfac.structure is not None
    held = {f.name for ly in kfac.layers.values() if kfac.structure.assignment.is_grad_worker(ly.unit, rank)
            for f in (ly.a, ly.g)}  # the decompositions this rank must hold
    return {
        "factors_stored": stored, "window_buffer": window, "decompositions": usage["decompositions"],
        "decompositions_all": 4 * sum(f.dim if f.diagonal else f.dim * f.dim + f.dim for f in kfac.factors().values()),
        # a storage dtype too narrow for the statistics shows up here (FP16 flushes small G values to 0)
        "all_zero_factors": sum(1 for f in kfac.factors().values() if f.value is not None and not f.value.any()),
        "missing_decompositions": len(held - set(kfac.decompositions)),
        "peak_delta": peak_bytes(device) - base_peak,
        "peak_source": peak_source(device),
        "factors": len(kfac.factors()), "layers": len(kfac.layers), "grad_workers": kfac.grad_workers,
    }


def row_of(cfg: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row from every rank's figures of one configuration."""
    world = len(ranks)
    first = ranks[0]
    dec = [r["decompositions"] for r in ranks]
    return {"world": world, "strategy": strategy_name(world, first["grad_workers"]), "fraction": cfg["fraction"],
            "grad_workers": first["grad_workers"], "passes": cfg["passes"], "factor_dtype": cfg["factor_dtype"],
            "inv_dtype": cfg["inv_dtype"], "precision": f"{cfg['factor_dtype']}/{cfg['inv_dtype']}",
            "factors_stored_MB": first["factors_stored"] / MB, "window_buffer_MB": first["window_buffer"] / MB,
            "decompositions_MB_mean": sum(dec) / world / MB, "decompositions_MB_max": max(dec) / MB,
            "decompositions_all_MB": first["decompositions_all"] / MB,
            "kfac_MB_per_rank_max": max(r["factors_stored"] + r["window_buffer"] + r["decompositions"]
                                        for r in ranks) / MB,
            "peak_delta_MB_max": max(r["peak_delta"] for r in ranks) / MB, "peak_source": first["peak_source"],
            "all_zero_factors": first["all_zero_factors"],
            "missing_decompositions": max(r["missing_decompositions"] for r in ranks),
            "factors": first["factors"], "layers": first["layers"], "ranks": ranks}


def summarise(single: list[dict[str, Any]], dist_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The three claims as numbers: flat in passes, half-precision factor storage, decompositions per rank."""
    out: dict[str, Any] = {}
    by_dtype: dict[str, list[dict[str, Any]]] = {}
    for r in single:
        by_dtype.setdefault(r["precision"], []).append(r)
    out["kfac_MB_spread_over_passes"] = {d: max(r["kfac_MB_per_rank_max"] for r in rs)
                                         - min(r["kfac_MB_per_rank_max"] for r in rs) for d, rs in by_dtype.items()}
    out["peak_delta_MB_by_passes"] = {d: {r["passes"]: r["peak_delta_MB_max"] for r in rs}
                                      for d, rs in by_dtype.items()}
    if "fp32/fp32" in by_dtype:
        fp32 = by_dtype["fp32/fp32"][0]
        out["kfac_MB_ratio_to_fp32"] = {d: rs[0]["kfac_MB_per_rank_max"] / fp32["kfac_MB_per_rank_max"]
                                        for d, rs in by_dtype.items()}
        out["stored_factor_ratio_to_fp32"] = {d: rs[0]["factors_stored_MB"] / fp32["factors_stored_MB"]
                                              for d, rs in by_dtype.items()}
        out["factor_memory_with_window_ratio_to_fp32"] = {
            d: (rs[0]["factors_stored_MB"] + rs[0]["window_buffer_MB"])
            / (fp32["factors_stored_MB"] + fp32["window_buffer_MB"]) for d, rs in by_dtype.items()}
    out["precision_loss"] = {f"{r['factor_dtype']} x{r['passes']}": {
        "all_zero_factors": r["all_zero_factors"], "missing_decompositions": r["missing_decompositions"]}
        for r in single if r["all_zero_factors"] or r["missing_decompositions"]}
    out["decompositions_share_per_rank"] = {f"{r['world']}:{r['strategy']}": r["decompositions_MB_mean"]
                                            / r["decompositions_all_MB"] for r in dist_rows}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("memory", __doc__)
    p.add_argument("--size", default="mini", choices=[s for s in SIZES if s != "large"],
                   help="BERT size (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--batch", type=int, default=4, help="micro-batch per pass (default: %(default)s)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--passes", type=int, nargs="+", default=[1, 2, 4, 8], help="accumulation passes per step")
    p.add_argument("--dtypes", nargs="+", default=["fp32", "fp16", "bf16"], choices=["fp32", "fp16", "bf16"],
                   help="factor storage dtypes")
    p.add_argument("--inv-dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "fp16", "bf16"],
                   help="decomposition storage dtypes (inv_dtype) of the half-precision rows; FP32 factors: fp32 only")
    p.add_argument("--worlds", type=int, nargs="*", default=[2, 4], help="world sizes for the fraction sweep")
    p.add_argument("--parallel", type=int, default=2, help="single-process configurations run at once")
    p.add_argument("--device", default="cpu", help="device of the single-process runs (distributed: always CPU)")
    args = p.parse_args(argv)
    base = {"size": args.size, "vocab": args.vocab, "batch": args.batch, "seq": args.seq, "device": args.device,
            "fraction": 1.0, "passes": 1, "factor_dtype": "fp32", "inv_dtype": "fp32"}
    jobs: list[tuple[dict[str, Any], int]] = [({**base, "factor_dtype": d, "inv_dtype": i, "passes": n}, 1)
                                              for d in args.dtypes for i in args.inv_dtypes for n in args.passes
                                              if d != "fp32" or i == "fp32"]
    for world in args.worlds:
        divisors = [k for k in range(1, world + 1) if world % k == 0]
        jobs += [({**base, "fraction": k / world}, world) for k in divisors]
    single_cfgs = [cfg for cfg, world in jobs if world == 1]
    single = [row_of(cfg, [res]) for cfg, res in zip(single_cfgs, isolated(_measure, [(c,) for c in single_cfgs],
                                                                             parallel=args.parallel))]
    dist_rows = [row_of(cfg, spawn(_measure, world, cfg))
                 for cfg, world in tqdm([j for j in jobs if j[1] > 1], desc="distributed configurations")]
    rows = single + dist_rows
    summary = summarise(single, dist_rows)
    info = machine()
    print(f"K-FAC memory, BERT-{args.size} ({single[0]['layers'] if single else ''} K-FAC layers), micro-batch "
          f"{args.batch}x{args.seq}\n{machine_line(info)}\n")
    cols = ["factor_dtype", "inv_dtype", "passes", "factors_stored_MB", "window_buffer_MB", "decompositions_MB_max",
            "kfac_MB_per_rank_max", "peak_delta_MB_max", "all_zero_factors", "missing_decompositions"]
    if single:
        print(table(single, cols) + "\n")
    if dist_rows:
        print(table(dist_rows, ["world", "strategy", "grad_workers", "factors_stored_MB", "decompositions_MB_mean",
                                "decompositions_MB_max", "decompositions_all_MB", "kfac_MB_per_rank_max",
                                "peak_delta_MB_max"]) + "\n")
    for key, value in summary.items():
        print(f"{key}: {value}")
    write_json({"machine": info, "settings": {**vars(args), "out": str(args.out)}, "summary": summary,
                "rows": rows}, args.out)
    print(f"\nwrote {args.out}")
    return {"rows": rows, "summary": summary}


if __name__ == "__main__":
    main()
