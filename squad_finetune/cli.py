"""Command line of the fine-tuning job.

    python -m squad_finetune ...                             # one process
    deepspeed --num_gpus N --module squad_finetune ...       # N ranks
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "ds_configs" / "squad_tiny_cpu.json"

EPILOG = """\
examples:
  # fine-tune a bert_pretrain phase-2 output on the built-in QA data, 2 CPU ranks
  deepspeed --num_gpus 2 --module squad_finetune --model runs/pretrain/phase2/model --output runs/squad
  # any SQuAD v1.1 train/eval pair (e.g. made with python -m squad_finetune.split)
  deepspeed --num_gpus 8 --module squad_finetune --model MODEL_DIR --train-file train.json --eval-file dev.json \\
      --config ds_configs/squad_bert_large.json --output runs/squad_large
  # score a fine-tuned model (the job's OUTPUT/model directory) on a dev file
  python -m squad_finetune --eval-only --checkpoint runs/squad/model --eval-file dev.json --output runs/eval

outputs (in --output): eval_results.json (exact_match, f1, questions), predictions.json (question id -> answer),
metrics.jsonl (config, training loss/lr/throughput every --log-every steps, eval scores), model/ (fine-tuned
weights + tokenizer, loadable with --checkpoint), data/ (generated built-in QA files, when used).
Recipe values (epochs, lr, warmup, window sizes) come from the config file's "optimizer" and "squad_finetune"
sections; the recipe flags override them. K-FAC is on when the config has a "kfac" section.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m squad_finetune", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Fine-tune a BERT checkpoint on SQuAD v1.1 (span extraction) with DeepSpeed and kaisa_ds, "
        "then report exact match and F1 with the official metric.",
    )
    io = p.add_argument_group("data and model")
    io.add_argument("--model", type=Path, help="model directory to fine-tune: a bert_pretrain phase-2 output or "
                    "any local HF directory with weights and a tokenizer (required unless --eval-only --checkpoint)")
    io.add_argument("--train-file", type=Path, help="SQuAD v1.1 JSON training file (default: the built-in QA data)")
    io.add_argument("--eval-file", type=Path, help="SQuAD v1.1 JSON evaluation file (default: the built-in QA data)")
    io.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                    help=f"DeepSpeed config with the job's sections (default: {DEFAULT_CONFIG.name})")
    io.add_argument("--output", type=Path, default=Path("runs/squad_finetune"),
                    help="output folder (default: runs/squad_finetune)")
    mode = p.add_argument_group("mode")
    mode.add_argument("--eval-only", action="store_true", help="no training: evaluate --checkpoint (or --model)")
    mode.add_argument("--checkpoint", type=Path,
                      help="fine-tuned model directory to evaluate in --eval-only mode (a run's OUTPUT/model)")
    mode.add_argument("--eval-before", action="store_true",
                      help="also score the starting model before training (logged in metrics.jsonl)")
    recipe = p.add_argument_group("recipe overrides (default: the config file, else BERT's SQuAD recipe)")
    recipe.add_argument("--epochs", type=int, help="training epochs (recipe default 2)")
    recipe.add_argument("--max-steps", type=int, help="stop after this many optimizer steps (default: no limit)")
    recipe.add_argument("--lr", type=float, help="AdamW peak learning rate (recipe default 3e-5)")
    recipe.add_argument("--warmup-proportion", type=float,
                        help="share of steps with linear warmup before linear decay to 0 (recipe default 0.1)")
    recipe.add_argument("--max-seq-length", type=int, help="window length in tokens (recipe default 384)")
    recipe.add_argument("--doc-stride", type=int,
                        help="context tokens shared by consecutive windows (recipe default 128)")
    recipe.add_argument("--max-query-length", type=int, help="questions are cut to this many tokens (default 64)")
    recipe.add_argument("--n-best", type=int, help="start and end candidates per window (recipe default 20)")
    recipe.add_argument("--max-answer-length", type=int, help="longest answer in tokens (recipe default 30)")
    recipe.add_argument("--seed", type=int, help="seed of the head initialisation and data order (default 42)")
    misc = p.add_argument_group("other")
    misc.add_argument("--eval-batch-size", type=int, default=64, help="windows per eval batch per rank (default 64)")
    misc.add_argument("--max-train-articles", type=int, help="use only the first N articles of the train file")
    misc.add_argument("--max-eval-articles", type=int, help="use only the first N articles of the eval file")
    misc.add_argument("--builtin-articles", type=int,
                      help="articles of built-in QA data to generate (default: the generator's default)")
    misc.add_argument("--builtin-seed", type=int, default=0,
                      help="seed of the built-in corpus (default 0, the pretraining corpus's seed)")
    misc.add_argument("--log-every", type=int, default=10, help="optimizer steps per metrics.jsonl line (default 10)")
    misc.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    return p


RECIPE_FLAGS = ("epochs", "max_steps", "lr", "warmup_proportion", "max_seq_length", "doc_stride",
                "max_query_length", "n_best", "max_answer_length", "seed")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if rank != 0:
        import datasets

        datasets.disable_progress_bars()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

    from squad_finetune.job import JobOptions, run_job
    from squad_finetune.model import ModelDirectoryError
    from squad_finetune.settings import ConfigError
    from squad_finetune.squad_json import SquadFormatError

    for name in ("eval_batch_size", "log_every"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    opts = JobOptions(
        output=args.output, config=args.config, model=args.model, checkpoint=args.checkpoint,
        train_file=args.train_file, eval_file=args.eval_file, eval_only=args.eval_only, eval_before=args.eval_before,
        eval_batch_size=args.eval_batch_size, max_train_articles=args.max_train_articles,
        max_eval_articles=args.max_eval_articles, builtin_articles=args.builtin_articles,
        builtin_seed=args.builtin_seed, log_every=args.log_every,
    )
    try:
        result = run_job(opts, {k: getattr(args, k) for k in RECIPE_FLAGS})
    except (ConfigError, ModelDirectoryError, SquadFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if result is not None:
        s = result.scores
        before = (f" (before training: f1 {result.initial_scores.f1:.2f})" if result.initial_scores else "")
        trained = "eval only" if args.eval_only else f"{result.steps} steps in {result.train_seconds:.0f} s"
        print(f"SQuAD v1.1 on {s.total} questions of {result.eval_file.name}: exact_match {s.exact_match:.2f}, "
              f"f1 {s.f1:.2f}{before} | {trained} | results: {result.output / 'eval_results.json'}")
    return 0
