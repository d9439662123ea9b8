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

from bert_pretrain.data.tokenizer import MAX_UNK_RATE, MIN_VOCAB
from squad_finetune.settings import RECIPE_CONFIG, RECIPE_MIN_HIDDEN, TINY_CONFIG, recipe_defaults

EPILOG = f"""\
examples:
  # fine-tune bert_pretrain's phase-2 model (its <output>/final) on the built-in QA data, 2 CPU ranks
  deepspeed --num_gpus 2 --module squad_finetune --model runs/bert/phase2/final --output runs/squad
  # any SQuAD v1.1 train/eval pair (e.g. made with python -m squad_finetune.split)
  deepspeed --num_gpus 8 --module squad_finetune --model MODEL_DIR --train-file train.json --eval-file dev.json \\
      --config ds_configs/squad_bert_large.json --output runs/squad_large
  # score a fine-tuned model (the job's OUTPUT/model directory) on a dev file
  python -m squad_finetune --eval-only --checkpoint runs/squad/model --eval-file dev.json --output runs/eval

outputs (in --output): eval_results.json (exact_match, f1, questions; and what the run used: model, config, kfac,
vocab_size, unk_share, eval_questions_in_train), predictions.json (question id -> answer),
metrics.jsonl (config, training loss/lr/throughput every --log-every steps, eval scores), model/ (fine-tuned
weights + tokenizer, loadable with --checkpoint), data/ (generated built-in QA files, when used).
Recipe values (epochs, lr, warmup, window sizes) come from the config file's "optimizer" and "squad_finetune"
sections; the recipe flags override them. Without --config the model's width picks the file:
{RECIPE_CONFIG.name} (BERT's SQuAD recipe) for hidden_size >= {RECIPE_MIN_HIDDEN} (BERT-base and larger),
{TINY_CONFIG.name} (tuned for bert_pretrain's tiny and mini models on CPU) below. K-FAC is on when the config
has an enabled "kfac" section (e.g. the *_kfac.json files). Refused before training: a tokenizer under {MIN_VOCAB}
tokens, one that keeps capitals over an uncased vocabulary, and data whose text is more than --max-unk-rate [UNK]
under the model's tokenizer.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m squad_finetune", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Fine-tune a BERT checkpoint on SQuAD v1.1 (span extraction) with DeepSpeed and kaisa_ds, "
        "then report exact match and F1 with the official metric.",
    )
    io = p.add_argument_group("data and model")
    io.add_argument("--model", type=Path, help="model directory to fine-tune: a bert_pretrain run's <output>/final "
                    "or any local HF directory with weights and a tokenizer (required unless --eval-only --checkpoint)")
    io.add_argument("--train-file", type=Path, help="SQuAD v1.1 JSON training file (default: the built-in QA data)")
    io.add_argument("--eval-file", type=Path, help="SQuAD v1.1 JSON evaluation file (default: the built-in QA data)")
    io.add_argument("--config", type=Path,
                    help=f"DeepSpeed config with the job's sections (default: {RECIPE_CONFIG.name} for models at "
                    f"least as wide as BERT-base, hidden_size >= {RECIPE_MIN_HIDDEN}; {TINY_CONFIG.name} for "
                    "smaller ones)")
    io.add_argument("--output", type=Path, default=Path("runs/squad_finetune"),
                    help="output folder (default: runs/squad_finetune)")
    mode = p.add_argument_group("mode")
    mode.add_argument("--eval-only", action="store_true", help="no training: evaluate --checkpoint (or --model)")
    mode.add_argument("--checkpoint", type=Path,
                      help="fine-tuned model directory to evaluate in --eval-only mode (a run's OUTPUT/model)")
    mode.add_argument("--eval-before", action="store_true",
                      help="also score the starting model before training (logged in metrics.jsonl)")
    base, tiny = recipe_defaults(RECIPE_CONFIG), recipe_defaults(TINY_CONFIG)

    def default(name: str) -> str:
        if name not in SECTION_FLAGS:
            return f"default {base[name]}"
        if base[name] == tiny[name]:
            return f"default: the config's; {base[name]:g} in both default configs"
        return (f"default: the config's; without --config {base[name]:g} for BERT-base-sized models and larger, "
                f"{tiny[name]:g} for smaller ones")

    recipe = p.add_argument_group("recipe overrides (default: the config file, else BERT's SQuAD recipe)")
    recipe.add_argument("--epochs", type=int, help=f"training epochs ({default('epochs')})")
    recipe.add_argument("--max-steps", type=int, help="stop after this many optimizer steps (default: no limit; the "
                        "epochs still bound the run, with a warning when they allow fewer)")
    recipe.add_argument("--lr", type=float, help=f"AdamW peak learning rate ({default('lr')})")
    recipe.add_argument("--warmup-proportion", type=float, help="share of steps with linear warmup before linear "
                        f"decay to 0 ({default('warmup_proportion')})")
    recipe.add_argument("--max-seq-length", type=int, help=f"window length in tokens ({default('max_seq_length')})")
    recipe.add_argument("--doc-stride", type=int,
                        help=f"context tokens shared by consecutive windows ({default('doc_stride')})")
    recipe.add_argument("--max-query-length", type=int,
                        help=f"questions are cut to this many tokens ({default('max_query_length')})")
    recipe.add_argument("--n-best", type=int, help=f"start and end candidates per window ({default('n_best')})")
    recipe.add_argument("--max-answer-length", type=int,
                        help=f"longest answer in tokens ({default('max_answer_length')})")
    recipe.add_argument("--seed", type=int, help=f"seed of the head initialisation and data order ({default('seed')})")
    misc = p.add_argument_group("other")
    misc.add_argument("--eval-batch-size", type=int, default=64, help="windows per eval batch per rank (default 64)")
    misc.add_argument("--max-train-articles", type=int, help="use only the first N articles of the train file")
    misc.add_argument("--max-eval-articles", type=int, help="use only the first N articles of the eval file")
    misc.add_argument("--builtin-articles", type=int, help="articles of built-in QA data to generate (default: the "
                      "generator's default; only without --train-file/--eval-file)")
    misc.add_argument("--builtin-seed", type=int, help="seed of the built-in corpus (default 0, the pretraining "
                      "corpus's seed; only without --train-file/--eval-file)")
    misc.add_argument("--max-unk-rate", type=float, default=MAX_UNK_RATE,
                      help="refuse data whose contexts and questions are more than this share [UNK] under the "
                      f"model's tokenizer (default {MAX_UNK_RATE}, bert_pretrain's limit)")
    misc.add_argument("--log-every", type=int, default=10, help="optimizer steps per metrics.jsonl line (default 10)")
    misc.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    return p


RECIPE_FLAGS = ("epochs", "max_steps", "lr", "warmup_proportion", "max_seq_length", "doc_stride",
                "max_query_length", "n_best", "max_answer_length", "seed")
SECTION_FLAGS = ("epochs", "lr", "warmup_proportion", "max_seq_length", "doc_stride", "max_query_length", "n_best",
                 "max_answer_length")  # set by the config files (seed is not)
TRAINING_ONLY = ("train_file", "epochs", "max_steps", "lr", "warmup_proportion", "max_train_articles")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def unread_options(args: argparse.Namespace) -> str | None:
    """Why an option given would not be read by this run (None when every option is used): such options are refused,
    never silently dropped."""
    if args.checkpoint is not None and not args.eval_only:
        return ("--checkpoint is read only with --eval-only (it names a fine-tuned model to score); to fine-tune, "
                "give the starting model as --model")
    if args.eval_only and args.checkpoint is not None and args.model is not None:
        return "--eval-only scores --checkpoint; --model would be ignored: give one of --checkpoint or --model"
    if args.eval_only:
        given = [_flag(n) for n in TRAINING_ONLY if getattr(args, n) is not None]
        given += ["--eval-before"] if args.eval_before else []
        if given:
            return f"{', '.join(given)}: no effect with --eval-only (no training); leave them out"
    files = [_flag(n) for n in ("train_file", "eval_file") if getattr(args, n) is not None]
    builtin = [_flag(n) for n in ("builtin_articles", "builtin_seed") if getattr(args, n) is not None]
    if files and builtin:
        return (f"{', '.join(builtin)} size(s) the built-in QA data, which {' and '.join(files)} replace(s); "
                "leave them out")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    unread = unread_options(args)
    if unread is not None:
        parser.error(unread)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if rank != 0:
        import datasets

        datasets.disable_progress_bars()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

    from bert_pretrain.data.errors import DataError
    from squad_finetune.job import JobOptions, run_job
    from squad_finetune.model import ModelDirectoryError
    from squad_finetune.settings import ConfigError
    from squad_finetune.squad_json import SquadFormatError

    for name in ("eval_batch_size", "log_every"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if not 0 <= args.max_unk_rate <= 1:
        print(f"error: --max-unk-rate {args.max_unk_rate} must be between 0 and 1", file=sys.stderr)
        return 2
    opts = JobOptions(
        output=args.output, config=args.config, model=args.model, checkpoint=args.checkpoint,
        train_file=args.train_file, eval_file=args.eval_file, eval_only=args.eval_only, eval_before=args.eval_before,
        eval_batch_size=args.eval_batch_size, max_train_articles=args.max_train_articles,
        max_eval_articles=args.max_eval_articles, builtin_articles=args.builtin_articles,
        builtin_seed=args.builtin_seed if args.builtin_seed is not None else 0, log_every=args.log_every,
        max_unk_rate=args.max_unk_rate,
    )
    try:
        result = run_job(opts, {k: getattr(args, k) for k in RECIPE_FLAGS})
    except (ConfigError, ModelDirectoryError, SquadFormatError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if result is not None:
        s = result.scores
        before = (f" (before training: f1 {result.initial_scores.f1:.2f})" if result.initial_scores else "")
        trained = ("eval only" if args.eval_only else f"{result.steps} steps in {result.train_seconds:.0f} s, "
                   f"K-FAC {'on' if result.kfac else 'off'}")
        print(f"SQuAD v1.1 on {s.total} questions of {result.eval_file.name}: exact_match {s.exact_match:.2f}, "
              f"f1 {s.f1:.2f}{before} | {trained} | results: {result.output / 'eval_results.json'}")
    return 0
