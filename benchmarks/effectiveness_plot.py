"""K-FAC's effectiveness check for a bad damping next to a good one: two short BERT-tiny MLM runs on the same text,
one at the old library default (absolute damping 1e-3, a rescaled gradient for BERT's mean MLM loss) and one at the
library defaults (relative damping), each logged as ``bert_pretrain`` logs (``metrics.jsonl`` rows with ``kfac``)
and plotted by ``python -m kaisa_ds.report``.

    python -m benchmarks.effectiveness_plot --text runs/convergence/parts/749d18c5c858/tune.txt \\
        --vocab ../shared/data/bert-vocab/vocab.txt --out benchmarks/results/effectiveness
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.accuracy import text_batches
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from kaisa_ds import KFACPreconditioner
from kaisa_ds.plan.bert_sizes import KAISA_SKIP
from kaisa_ds.report.cli import kfac_rows, plot

RUNS: dict[str, dict[str, Any]] = {"absolute_1e-3": {"damping": 1e-3}, "library_defaults": {}}


def run(folder: Path, batches: list[dict[str, torch.Tensor]], *, seq: int, inv_every: int,
        options: dict[str, Any]) -> None:
    model = bert_for_pretraining("tiny", seq=seq)
    precond = KFACPreconditioner(model, skip_layers=KAISA_SKIP, inv_update_steps=inv_every, lr=1e-3, **options)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "metrics.jsonl").open("w") as out:
        for step, batch in enumerate(batches, start=1):
            opt.zero_grad()
            loss = pretraining_loss(model, batch)
            loss.backward()
            precond.step()
            opt.step()
            out.write(json.dumps({"step": step, "loss": loss.item(), "kfac": precond.diagnostics_snapshot()}) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.effectiveness_plot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", type=Path, required=True)
    p.add_argument("--vocab", type=Path, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--inv-every", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    batches = text_batches(args.text, args.vocab, batch=args.batch, seq=args.seq, count=args.steps)
    for name, options in RUNS.items():
        run(args.out / name, batches, seq=args.seq, inv_every=args.inv_every, options=options)
        plot(kfac_rows(args.out / name / "metrics.jsonl"), args.out / f"{name}.png",
             title=f"K-FAC diagnostics, BERT-tiny MLM, {name.replace('_', ' ')}")
        print(args.out / f"{name}.png")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
