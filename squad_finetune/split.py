"""Command line: split one SQuAD file by article into a train file and an eval file.

    python -m squad_finetune.split dev-v1.1.json --train-out train.json --eval-out eval.json --eval-fraction 0.2
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from squad_finetune.data import split_by_article
from squad_finetune.squad_json import SquadFormatError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m squad_finetune.split",
        description="Split a SQuAD v1.1 file by article (every paragraph of an article stays on one side).",
    )
    parser.add_argument("source", type=Path, help="SQuAD v1.1 JSON file to split")
    parser.add_argument("--train-out", type=Path, required=True, help="where to write the training articles")
    parser.add_argument("--eval-out", type=Path, required=True, help="where to write the evaluation articles")
    parser.add_argument("--eval-fraction", type=float, default=0.2,
                        help="share of the articles (at least one) that go to the eval file (default 0.2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random choice of eval articles (default 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        s = split_by_article(args.source, args.train_out, args.eval_out, eval_fraction=args.eval_fraction,
                             seed=args.seed)
    except (SquadFormatError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"train: {s.train_articles} articles, {s.train_questions} questions -> {args.train_out}; "
          f"eval: {s.eval_articles} articles, {s.eval_questions} questions -> {args.eval_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
