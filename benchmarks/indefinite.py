"""How many of a BERT model's damped K-FAC factors are not positive definite in FP32: the factors the inverse
method sends past Cholesky to its clamped eigendecomposition (``kaisa_ds.decomposition.decompose.spd_inverse``),
and so what that fallback costs a decomposition round.

The factors are the product's own: a :class:`~kaisa_ds.KFACPreconditioner` (FP16 storage by default, as the
phase-1 configs) takes in ``--windows`` windows of ``--passes`` accumulated passes (running average, decay 0.95),
at a damping of 1 so its own decompositions never fall back. Then each dense factor, shifted as the inverse method
shifts it at every ``--dampings`` value (absolute: that value) and ``--relative-dampings`` value ``r`` (``√r`` × its
mean eigenvalue, the library's default mode), is
tried with FP32 Cholesky, and the failures are counted per factor size. (Every factor is damped as its layer is
preconditioned; an all-zero factor counts as positive definite.) The H100 found the old LU fallback's indefinite
inverses at BERT-Large (benchmarks/README.md, GPU suite, 2026-11-27); this counts what the fix inverts by eigh.

    python -m benchmarks.indefinite --size large --batch 16 --passes 8 --dampings 4.688e-5 1e-3
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.harness.batches import random_batch
from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from benchmarks.harness.output import publish, table
from kaisa_ds.damping import Damping, factor_shift
from kaisa_ds.enums import DampingMode
from kaisa_ds.plan.bert_sizes import KAISA_SKIP


def collect_factors(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Every dense factor's value after the windows, as the preconditioner stores it."""
    from kaisa_ds import KFACPreconditioner

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = bert_for_pretraining(args.size, vocab=30522, seq=args.seq).to(device)
    precond = KFACPreconditioner(model, compute_method="inverse", damping=1.0, kl_clip=None, factor_update_steps=1,
                                 inv_update_steps=1, factor_dtype=args.factor_dtype, skip_layers=KAISA_SKIP,
                                 factor_sample_fraction=args.sample_fraction, accumulation_steps=args.passes)
    for window in tqdm(range(args.windows), desc="windows", unit="window"):
        model.zero_grad(set_to_none=True)
        for p in range(args.passes):
            batch = random_batch(args.batch, args.seq, 30522, device, seed=window * args.passes + p)
            (pretraining_loss(model, batch) / args.passes).backward()
        precond.step()
    return {n: f.value for n, f in precond.factors().items() if f.value is not None and not f.diagonal}


def count(factors: dict[str, torch.Tensor], damping: Damping) -> dict[int, tuple[int, int]]:
    """Per factor size: (factors not positive definite after the shift, factors)."""
    failed: Counter[int] = Counter()
    total: Counter[int] = Counter()
    for value in factors.values():
        f = value.float()
        shift = factor_shift(damping, f, diagonal=False)
        _, info = torch.linalg.cholesky_ex(f + shift * torch.eye(f.shape[-1], device=f.device))
        total[f.shape[-1]] += 1
        failed[f.shape[-1]] += int(info.item() != 0)
    return {dim: (failed[dim], total[dim]) for dim in sorted(total)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    factors = collect_factors(args)
    rows = []
    dampings = ([Damping(DampingMode.ABSOLUTE, v) for v in args.dampings]
                + [Damping(DampingMode.RELATIVE, v) for v in args.relative_dampings])
    for damping in dampings:
        for dim, (failed, total) in count(factors, damping).items():
            rows.append({"damping": damping.describe(), "size": dim, "not_positive_definite": failed,
                         "factors": total, "share": failed / total})
    return {"machine": machine(), "settings": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows,
            "tokens_per_window": args.passes * args.batch * args.seq * args.sample_fraction}


def report(res: dict[str, Any]) -> str:
    s = res["settings"]
    head = (f"BERT-{s['size']}, {s['windows']} window(s) of {s['passes']} pass(es) of {s['batch']} x {s['seq']} "
            f"random tokens ({res['tokens_per_window']:.0f} statistic rows per window), {s['factor_dtype']} factors")
    cols = ["damping", "size", "not_positive_definite", "factors", "share"]
    return "\n".join([head, machine_line(res["machine"]), "", table(res["rows"], cols)])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("indefinite", __doc__)
    p.add_argument("--size", default="mini", help="BERT size (default: %(default)s)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--passes", type=int, default=8, help="accumulated passes per window (default: %(default)s)")
    p.add_argument("--windows", type=int, default=1, help="windows averaged into the factors (default: %(default)s)")
    p.add_argument("--factor-dtype", default="fp16", choices=["fp16", "bf16", "fp32"],
                   help="the factors' storage (default: %(default)s, as the phase-1 configs)")
    p.add_argument("--sample-fraction", type=float, default=1.0, help="factor_sample_fraction (default: 1)")
    p.add_argument("--dampings", type=float, nargs="+", default=[4.688e-5, 1e-3],
                   help="dampings to count at (default: the phase-1 config's and the GPU suite's)")
    p.add_argument("--relative-dampings", type=float, nargs="*", default=[100.0],
                   help="relative dampings to count at (default: %(default)s, the library's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if any(not math.isfinite(d) or d < 0 for d in args.dampings + args.relative_dampings):
        p.error(f"--dampings and --relative-dampings must be finite and >= 0, got {args.dampings} and "
                f"{args.relative_dampings}")
    res = measure(args)
    publish(res, report(res), args.out)
    return res


if __name__ == "__main__":
    main()
