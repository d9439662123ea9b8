"""Does computing only the upper triangle of a factor's ``xᵀ x`` pay? (issue 59, "the upper triangle only where it
pays")

A factor is symmetric, so the blocks below its diagonal are the transposes of those above. Split into k column
blocks, ``k(k+1)/2`` of the ``k²`` block products are computed (k = 2: 3 of 4; k = 4: 10 of 16), at the price of
more, smaller matrix products and the copies that fill the lower half. The library's own
:func:`kaisa_ds.factors.statistics.gram` is timed with ``blocks=1`` (one full product) and the block counts asked,
alternating, on random rows of the sizes a factor update sees (the 2,048-row cap; BERT's 128-4,096 features).
Each figure is the blocked time over the full one, measured side by side; the default split
(:func:`~kaisa_ds.factors.statistics.triangle_blocks`) is chosen from it.

    python -m benchmarks.gram_blocks
    python -m benchmarks.gram_blocks --features 256 1024 --rows 2048 8192 --device cuda
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import torch

from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.output import publish, table
from benchmarks.harness.timing import timed
from kaisa_ds.factors.statistics import gram


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n_rows in args.rows:
        for features in args.features:
            x = torch.randn(n_rows, features, generator=gen).to(device)
            counts = [1, *args.blocks]
            for k in counts:  # warm-up, and the check that every split gives the full product
                torch.testing.assert_close(gram(x, blocks=k), gram(x, blocks=1), rtol=1e-4, atol=1e-3 * n_rows ** 0.5)
            spent = dict.fromkeys(counts, 0.0)
            for _ in range(args.repeats):
                for k in counts:  # alternating: drift in the machine's speed reaches every split alike
                    spent[k] += timed(partial(gram, x, blocks=k), cuda=x.is_cuda)
            full = spent[1] / args.repeats
            row: dict[str, Any] = {"rows": n_rows, "features": features, "full_ms": 1e3 * full}
            row.update({f"blocks{k}_ratio": spent[k] / spent[1] for k in args.blocks})
            rows.append(row)
    return {"machine": machine(), "settings": {k: (str(v) if k == "out" else v) for k, v in vars(args).items()},
            "rows": rows}


def report(res: dict[str, Any]) -> str:
    blocks = res["settings"]["blocks"]
    head = (f"gram(x): full product against the upper {', '.join(str(k) for k in blocks)}-block triangle "
            f"(blocked time / full time; below 1 it pays), {res['settings']['repeats']} repeats alternating")
    columns = ["rows", "features", "full_ms", *[f"blocks{k}_ratio" for k in blocks]]
    return "\n".join([head, machine_line(res["machine"]), "", table(res["rows"], columns)])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("gram_blocks", __doc__)
    p.add_argument("--features", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 3072])
    p.add_argument("--rows", type=int, nargs="+", default=[2048])
    p.add_argument("--blocks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    res = measure(args)
    publish(res, report(res), args.out)
    return res


if __name__ == "__main__":
    main()
