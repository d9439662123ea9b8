"""Command line of ``python -m bert_pretrain`` (also ``deepspeed --num_gpus N --module bert_pretrain``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bert_pretrain",
        description="BERT pretraining (masked LM + next sentence prediction) with LAMB, optionally K-FAC. "
                    "Phase 1 uses sequences of 128 tokens, phase 2 of 512 and starts from phase 1's final weights. "
                    "Everything about optimisation (batch sizes, LAMB, precision, ZeRO, K-FAC) comes from --config.")
    p.add_argument("--phase", type=int, choices=[1, 2], required=True,
                   help="1: seq 128, max 20 predictions; 2: seq 512, max 80 predictions")
    p.add_argument("--config", type=Path, required=True, help="DeepSpeed JSON config (see ds_configs/)")
    p.add_argument("--data", type=Path, nargs="+", required=True,
                   help="raw text files: a document per blank-line-separated block (WikiText headings also split)")
    p.add_argument("--vocab", type=Path, help="BERT vocab.txt; default: train a WordPiece vocab on the corpus "
                   "(phase 2 uses the vocab saved with --init-checkpoint)")
    p.add_argument("--cased", action="store_true", help="keep case (default: lower-case, as bert-*-uncased)")
    p.add_argument("--output", type=Path, required=True, help="run folder: metrics.jsonl, loss.png, checkpoints/, "
                   "final/ (HF model + tokenizer), summary.json")
    p.add_argument("--data-cache", type=Path, help="where prepared Arrow shards go (default: <output>/../data)")
    p.add_argument("--model-size", default="tiny", help="tiny, mini, base, large, or a local model folder")
    p.add_argument("--init-checkpoint", type=Path, help="phase 2: the phase-1 final/ folder to start from")
    p.add_argument("--max-steps", type=int, help="optimizer steps (default: the config's lr_schedule.total_steps)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in <output>/checkpoints")
    p.add_argument("--save-every", type=int, default=50, help="optimizer steps between checkpoints (0: only at end)")
    p.add_argument("--eval-every", type=int, default=25, help="optimizer steps between held-out evaluations")
    p.add_argument("--eval-examples", type=int, default=256, help="held-out examples per evaluation")
    p.add_argument("--dupe-factor", type=int, default=5, help="copies of the corpus with different masks")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation, data order and masking")
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    return p
