"""Command line of ``python -m bert_pretrain``.

Under the DeepSpeed launcher use its ``--module`` flag (it has no ``-m``)::

    deepspeed --num_gpus N --module bert_pretrain --phase 1 --config ds_configs/... --output runs/p1
    deepspeed --num_gpus N bert_pretrain/__main__.py --phase 1 ...      # the same, as a script path
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from bert_pretrain.data.documents import SPLITS
from bert_pretrain.data.tokenizer import MAX_UNK_RATE
from bert_pretrain.eval_sets import named_text

# Defaults of flags that other flags make meaningless: the flags default to None, so a value given beside such a
# flag is refused (bert_pretrain.preflight) instead of silently ignored, and these apply when none is given.
MODEL_SIZE = "tiny"
VOCAB_SIZE = 8000
ARTICLES = 200


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``, so a 0 or negative count fails at parse time naming its flag
    (``--eval-every 0`` used to crash with ZeroDivisionError, ``--max-steps 0`` to run the config's steps)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small: use an integer >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def unit_fraction(text: str) -> float:
    """An argparse type: a float in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 1")
    return value

EXAMPLES = """examples (2 CPU ranks, built-in corpus, tiny model):
  deepspeed --num_gpus 2 --module bert_pretrain --phase 1 --config ds_configs/bert_tiny_phase1.json \\
      --output runs/bert/phase1 --max-steps 120
  deepspeed --num_gpus 2 --module bert_pretrain --phase 2 --config ds_configs/bert_tiny_phase2.json \\
      --output runs/bert/phase2 --init-checkpoint runs/bert/phase1/final --max-steps 30
real text with the real vocabulary:
  deepspeed --num_gpus 2 --module bert_pretrain --phase 1 --config ds_configs/bert_tiny_phase1_kfac.json \\
      --data ../shared/data/wikitext-2/valid.txt --vocab ../shared/data/bert-vocab/vocab.txt \\
      --model-size mini --output runs/wiki/phase1
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bert_pretrain", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="BERT pretraining (masked LM + next sentence prediction) following NVIDIA's two-phase recipe. "
                    "Phase 1 trains on sequences of 128 tokens, phase 2 on 512 tokens starting from phase 1's final "
                    "weights with its own optimizer and schedule. Batch sizes, LAMB, the learning-rate schedule, "
                    "fp16/bf16, ZeRO and K-FAC (its 'kfac' section) all come from --config.")
    run = p.add_argument_group("run")
    run.add_argument("--phase", type=int, choices=[1, 2], required=True,
                     help="1: sequences of 128 tokens, up to 20 masked; 2: 512 tokens, up to 80 masked")
    run.add_argument("--config", type=Path, required=True,
                     help="DeepSpeed JSON config (ds_configs/bert_*): batch sizes, optimizer (Lamb), lr_schedule "
                          "(PolyWarmUp), fp16/bf16, zero_optimization, and kfac.enabled to switch K-FAC on")
    run.add_argument("--output", type=Path, required=True,
                     help="run folder: metrics.jsonl, loss.png, summary.json, checkpoints/, and final/ (the "
                          "model and tokenizer for --init-checkpoint or SQuAD fine-tuning)")
    run.add_argument("--max-steps", type=at_least(1),
                     help="optimizer steps of this phase; also the schedule's total_steps (default: the config's "
                          "lr_schedule.total_steps)")
    run.add_argument("--seed", type=int, default=0,
                     help="seed of the weights, the data order, the masking and the built-in corpus (default 0)")
    run.add_argument("--resume", action="store_true",
                     help="continue from the newest intact checkpoint in <output>/checkpoints, exactly where it "
                          "stopped, with the vocabulary and data it was trained on (refused if they changed); a "
                          "finished run is left as it is")
    run.add_argument("--overwrite", action="store_true",
                     help="start over in an --output that already holds a run (its summary and checkpoints are "
                          "deleted); without it such a folder is refused, so results are never lost by accident")
    run.add_argument("--save-every", type=at_least(0), default=50,
                     help="optimizer steps between checkpoints (0: only the final one; default 50)")
    run.add_argument("--keep-checkpoints", type=at_least(0), default=3,
                     help="how many of the newest checkpoints to keep (0: all; default 3)")
    run.add_argument("--eval-every", type=at_least(1), default=25,
                     help="optimizer steps between held-out evaluations (always at the end; default 25)")
    run.add_argument("--eval-examples", type=at_least(1), default=512,
                     help="held-out examples per evaluation, spread over the ranks (default 512)")
    run.add_argument("--stop-after", type=at_least(1),
                     help="stop after this many steps of this invocation without a final save, as if killed "
                          "(to exercise --resume); the schedule still follows --max-steps")
    run.add_argument("--stop-at-heldout", type=float, metavar="LOSS",
                     help="end the phase at the first evaluation whose held-out MLM loss is at or below LOSS, saving "
                          "the model there as final/ (the schedule still follows --max-steps): e.g. the baseline's "
                          "final loss, to take a model at the point it reaches the baseline's quality")
    model = p.add_argument_group("model")
    model.add_argument("--model-size",
                       help=f"tiny (hidden 128, 2 layers), mini (256, 4), base, large, or a local model folder "
                            f"(default {MODEL_SIZE}); with --init-checkpoint the model is that one, so a size given "
                            "must be its size")
    model.add_argument("--init-checkpoint", type=Path,
                       help="start from these weights: phase 2 takes phase 1's <output>/final (its vocab.txt is "
                            "used; a --vocab given must have the same content)")
    model.add_argument("--from-scratch", action="store_true",
                       help="allow phase 2 without --init-checkpoint, from random weights (refused otherwise: phase 2 "
                            "continues phase 1)")
    data = p.add_argument_group("data")
    data.add_argument("--data", type=Path, nargs="+",
                      help="the corpus (default: the built-in generated encyclopedia): plain text files (.txt or "
                           "any name; WikiText's '= Heading =' lines start a new document), gzip-compressed text "
                           "(.txt.gz), JSON Lines (.jsonl, .jsonl.gz) or Parquet (.parquet) with a --text-column, "
                           "HF datasets folders written by save_to_disk, or folders of such files; all read as a "
                           "stream. See --doc-split")
    data.add_argument("--text-column", default="text",
                      help="the column holding the text in .jsonl, .parquet and datasets inputs, of --data and "
                           "--eval-data (default text); each row is read like a small text file")
    data.add_argument("--data-split", metavar="SPLIT",
                      help="the split of a DatasetDict folder to read (default: train, or its only split), of "
                           "--data and --eval-data")
    data.add_argument("--eval-data", type=named_text, nargs="+", metavar="NAME=FILE",
                      help="evaluate on these texts instead of the documents held out of --data: each is prepared "
                           "with the training vocabulary and a fixed seed (the same examples for every run), read "
                           "with --encoding and checked against --max-unk-rate as --data is, and logged as "
                           "heldout_<NAME>_mlm_loss etc.; e.g. tune=parts/tune.txt")
    data.add_argument("--doc-split", choices=SPLITS, default="blocks",
                      help="what a document is: a blank-line-separated block (default) or a whole file (a whole row "
                           "of a .jsonl/.parquet/datasets input)")
    data.add_argument("--articles", type=at_least(1),
                      help=f"articles of the built-in corpus (default {ARTICLES}); refused with --data, which "
                           "replaces it")
    data.add_argument("--vocab", type=Path,
                      help="BERT vocab.txt (e.g. ../shared/data/bert-vocab/vocab.txt); default: train a "
                           "WordPiece vocabulary on the corpus and keep it with the prepared data")
    data.add_argument("--vocab-size", type=at_least(100),
                      help=f"size of a trained vocabulary (default {VOCAB_SIZE}; the corpus may give fewer, logged "
                           "and recorded in summary.json); refused with --vocab or --init-checkpoint, whose "
                           "vocabulary is used")
    data.add_argument("--cased", action="store_true",
                      help="keep letter case (default: lower-case, as uncased BERT); a given vocabulary must match: "
                           "--cased with an uncased one, or a cased one without --cased, is refused")
    data.add_argument("--data-cache", type=Path,
                      help="folder of the prepared Arrow shards, reused while inputs and settings match "
                           "(default: <output>/../data, so both phases share one vocabulary)")
    data.add_argument("--dupe-factor", type=at_least(1), default=5,
                      help="copies of the corpus, each with different masks and pairings (default 5)")
    data.add_argument("--max-seq-length", type=at_least(8),
                      help="tokens per sequence (default 128 in phase 1, 512 in 2)")
    data.add_argument("--max-predictions", type=at_least(1),
                      help="masked tokens per sequence at most (default 20 in phase 1, 80 in phase 2)")
    data.add_argument("--encoding", default="utf-8",
                      help="text encoding of the --data and --eval-data files (default utf-8; a file that does not "
                           "decode is refused, naming it, instead of losing its accented letters)")
    data.add_argument("--max-unk-rate", type=unit_fraction, default=MAX_UNK_RATE,
                      help=f"refuse a corpus or --eval-data set whose tokens are more than this share [UNK] (default "
                           f"{MAX_UNK_RATE:g}: the vocabulary does not fit the text); checked on reused prepared "
                           "data too. The share is recorded in summary.json")
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher; not needed by hand")
    return p
