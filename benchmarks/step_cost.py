"""Step cost of K-FAC on BERT: forward+backward, optimizer step, every K-FAC stage, and the amortised overhead.

The amortised overhead over one decomposition interval of ``inv_update_steps`` steps with factors every
``factor_update_steps`` is computed exactly from three measured step kinds:
  factor steps  (hooks capture statistics; factors all-reduced and committed),
  plain steps   (only cached decompositions are applied),
  decomposition steps (a factor step that also recomputes every decomposition),
each the median of ``--repeats`` timings, against a baseline without K-FAC. Also times one FP32 ``eigh`` (and
damped inverse) per factor size.

    python -m benchmarks.step_cost --size mini            # CPU
    python -m benchmarks.step_cost --size large --dtype bf16 --batch 32   # GPU
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    KAISA_SKIP,
    RESULTS,
    bert_for_pretraining,
    machine,
    median_seconds,
    pretraining_loss,
    random_batch,
    table,
    write_json,
)


def _optimizer(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, str]:
    from kaisa_ds.optim.select import build_lamb, lamb_param_groups

    return build_lamb(lamb_param_groups(model, weight_decay=0.01), lr=1e-3)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from kaisa_ds import KFACPreconditioner

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    model = bert_for_pretraining(args.size, seq=args.seq).to(device)
    opt, opt_name = _optimizer(model)
    batch = random_batch(args.batch, args.seq, 30522, device)

    def fwd_bwd() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = pretraining_loss(model, *batch)
        opt.zero_grad()
        loss.backward()

    fwd_bwd()
    opt.step()  # warm-up, allocates optimizer state
    base_fb = median_seconds(fwd_bwd, args.repeats, cuda=cuda)
    opt_step = median_seconds(opt.step, args.repeats, cuda=cuda)
    kfac = KFACPreconditioner(model, factor_update_steps=args.factor_every, inv_update_steps=args.inv_every,
                              damping=0.001, kl_clip=0.001, lr=1e-3, skip_layers=KAISA_SKIP,
                              factor_dtype=args.factor_dtype)
    kfac.timer.sync = cuda
    kinds: dict[str, list[dict[str, float]]] = {"decomposition": [], "factor": [], "plain": []}
    if args.inv_every % args.factor_every:
        raise ValueError("--inv-every must be a multiple of --factor-every")
    step_of = {"decomposition": args.inv_every, "factor": args.factor_every, "plain": 1}
    for _ in range(args.repeats):
        for kind, step in step_of.items():
            kfac.steps = step  # a step counter of the wanted kind (the hooks read it during fwd_bwd)
            t0 = time.perf_counter()
            fwd_bwd()
            if cuda:
                torch.cuda.synchronize()
            fb = time.perf_counter() - t0
            kfac.step()
            kinds[kind].append({"fwd_bwd": fb, **kfac.timings})
    med = {k: {s: sorted(r[s] for r in rows)[len(rows) // 2] for s in rows[0]} for k, rows in kinds.items()}
    stages = [s for s in med["plain"] if s != "fwd_bwd"]
    per_kind = {k: (v["fwd_bwd"] - base_fb) + sum(v[s] for s in stages if s != "factor_capture")
                for k, v in med.items()}  # extra over the baseline: hook time is inside fwd_bwd
    n_factor = args.inv_every // args.factor_every - 1
    n_plain = args.inv_every - n_factor - 1
    interval = per_kind["decomposition"] + n_factor * per_kind["factor"] + n_plain * per_kind["plain"]
    amortised = interval / args.inv_every
    baseline_step = base_fb + opt_step
    return {"machine": machine(), "settings": vars(args) | {"optimizer": opt_name, "device": str(device)},
            "baseline": {"fwd_bwd_s": base_fb, "optimizer_step_s": opt_step},
            "kfac_stage_seconds": med, "kfac_extra_seconds_per_step_kind": per_kind,
            "amortised_kfac_seconds": amortised, "amortised_overhead": amortised / baseline_step,
            "decompositions": decomposition_times(args.decomp_sizes, device)}


def decomposition_times(sizes: list[int], device: torch.device) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        x = torch.randn(2 * n, n, device=device)
        f = x.t() @ x / (2 * n)
        eye = torch.eye(n, device=device)
        reps, cuda = (3 if n <= 1024 else 1), device.type == "cuda"

        def eigh(f: torch.Tensor = f) -> Any:
            return torch.linalg.eigh(f)

        def inverse(f: torch.Tensor = f, eye: torch.Tensor = eye) -> Any:
            return torch.linalg.inv(f + 1e-3 * eye)

        rows.append({"size": n, "eigh_fp32_s": median_seconds(eigh, reps, cuda=cuda),
                     "inverse_fp32_s": median_seconds(inverse, reps, cuda=cuda)})
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="mini", choices=["tiny", "mini", "base", "large"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="autocast dtype")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--factor-every", type=int, default=5, help="factor_update_steps")
    p.add_argument("--inv-every", type=int, default=50, help="inv_update_steps")
    p.add_argument("--factor-dtype", default=None, help="factor storage dtype (fp16, bf16)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decomp-sizes", type=int, nargs="*", default=[256, 1024, 4096])
    p.add_argument("--out", type=Path, default=RESULTS / "step_cost.json")
    args = p.parse_args(argv)
    res = measure(args)
    base = res["baseline"]
    rows = [{"what": "baseline forward+backward", "seconds": base["fwd_bwd_s"]},
            {"what": "optimizer step", "seconds": base["optimizer_step_s"]}]
    for kind, stages in res["kfac_stage_seconds"].items():
        rows += [{"what": f"K-FAC {kind} step: {s}", "seconds": v} for s, v in stages.items() if v > 0]
    rows.append({"what": f"amortised K-FAC per step (interval {args.inv_every})",
                 "seconds": res["amortised_kfac_seconds"]})
    print(table(rows, ["what", "seconds"]))
    print(f"\namortised K-FAC overhead: {100 * res['amortised_overhead']:.1f}% of a "
          f"{res['settings']['optimizer']} step (BERT-{args.size}, {args.dtype}, batch {args.batch}x{args.seq})\n")
    print(table(res["decompositions"], ["size", "eigh_fp32_s", "inverse_fp32_s"]))
    write_json(res, args.out)
    print(f"\nwrote {args.out}")
    return res


if __name__ == "__main__":
    main()
