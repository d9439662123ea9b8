"""kaisa_ds against kfac-pytorch (gpauloski/kfac-pytorch, the KAISA reference implementation), side by side.

Three identical copies of one HF BertForPreTraining (same weights, same batch): a baseline without K-FAC, one with
kaisa_ds's KFACPreconditioner and one with kfac-pytorch's, both with the same settings: factors every
``--factor-every`` steps, decompositions every ``--inv-every``, eigen method, damping 0.001, factor_decay 0.95,
kl_clip 0.001, the same skip_layers (KAISA's BERT recipe: the 24 encoder Linear layers of BERT-mini), fp32, one
process. As in benchmarks.step_cost, each kind of step of a decomposition interval (decomposition, factor, plain) is
measured for real by setting each library's step counter, and the interval average is exact. K-FAC time of a kind
= forward+backward with the library's hooks - the baseline's forward+backward (the hooks' extra cost) + the wall
time of ``precond.step()``. The two libraries alternate within every round and the one that goes first flips each
round, so other work on the machine falls on both; medians of ``--repeats`` rounds after ``--warmup``. Headline:
the amortised K-FAC time per step of each and the ratio kfac-pytorch / kaisa_ds (issue 9's target: >= 2).

Stages: kaisa_ds's from ``precond.timings``; kfac-pytorch's by timing its layer methods (statistics and running
average in the hooks, eigendecompositions, preconditioning, KL clip, gradient write-back) without changing them.

Also: K-FAC memory after a decomposition step (kaisa_ds: ``memory_usage()``; kfac-pytorch: every tensor its layer
objects hold), each library's peak-RSS rise in its own fresh process, and whether the two compute the same
preconditioned gradients after one factor+decomposition step on the same batch; where they differ, the two
conventions behind it (kfac-pytorch starts a factor's running average from the identity and does not scale G by
the batch size) are measured, then kfac-pytorch is given kaisa_ds's factors to show that the rest agrees.

kfac-pytorch is not a dependency of this project; see the message printed when it is missing (INSTALL in
kfac_pytorch.py).

    PYTHONPATH=$PWD:/tmp/kfp-site python -m benchmarks.versus_kfac_pytorch          # BERT-mini, batch 32 x 128
    PYTHONPATH=$PWD:/tmp/kfp-site python -m benchmarks.versus_kfac_pytorch --batch 8 --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from benchmarks.harness.cli import add_side_by_side_flags, check_side_by_side_flags, parser
from benchmarks.harness.output import publish
from benchmarks.versus_kfac_pytorch.kfac_pytorch import import_kfac
from benchmarks.versus_kfac_pytorch.measure import measure
from benchmarks.versus_kfac_pytorch.report import report


def build_parser() -> argparse.ArgumentParser:
    p = parser("versus_kfac_pytorch", __doc__)
    add_side_by_side_flags(p, help_for={
        "--lr": "K-FAC's lr for the KL clip, both libraries",
        "--sample-fraction": "kaisa_ds's factor_sample_fraction (kfac-pytorch has none; default 1: exact)",
        "--inv-dtype": "inv_dtype of both libraries: decompositions stored and applied in it (default fp32)"})
    p.add_argument("--kfp-no-prediv", action="store_true",
                   help="turn off kfac-pytorch's compute_eigenvalue_outer_product (its cached 1/(dg daᵀ + damping), "
                        "on by default there)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parsed and checked arguments (errors exit with status 2 before anything is built)."""
    p = build_parser()
    args = p.parse_args(argv)
    check_side_by_side_flags(p, args)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import_kfac()  # exits with the install steps when kfac-pytorch is missing
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    res = measure(args)
    publish(res, report(res), args.out)
    return res


if __name__ == "__main__":
    main()
