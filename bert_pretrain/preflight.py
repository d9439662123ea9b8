"""Cheap checks of the command line's files and flags, run before anything heavy (data preparation, the
engine), so a wrong path fails in seconds with a message naming the flag instead of after minutes."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from argparse import Namespace
from pathlib import Path
from typing import Any

from bert_pretrain.data.errors import DataError
from bert_pretrain.data.sources import Source, is_dataset_dict, resolve
from bert_pretrain.data.tokenizer import check_casing, vocab_digest, vocab_tokens
from kaisa_ds.plan.bert_sizes import SIZES

logger = logging.getLogger(__name__)


def check_writable(folder: Path, *, flag: str) -> None:
    """Create ``folder`` if needed and prove a file can be written in it."""
    if folder.exists() and not folder.is_dir():
        raise DataError(f"{flag} {folder} is a file, not a folder; give a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise DataError(f"{flag} {folder} is not writable ({exc.strerror or exc}); choose another folder or fix "
                        "its permissions") from exc


def check_args(args: Namespace) -> None:
    """The flags' files exist and are what they claim; phase 2 has weights to start from."""
    if args.phase == 2 and args.init_checkpoint is None and not args.from_scratch:
        raise DataError("--phase 2 without --init-checkpoint would train from random weights: pass "
                        "--init-checkpoint <phase-1 output>/final, or --from-scratch if that is what you want")
    if args.init_checkpoint is not None and not (args.init_checkpoint / "config.json").is_file():
        raise DataError(f"--init-checkpoint {args.init_checkpoint}: no model there (no config.json); give the "
                        "final/ folder of a phase-1 run")
    if not args.config.is_file():
        raise DataError(f"--config {args.config} does not exist; give a DeepSpeed JSON config such as "
                        "ds_configs/bert_tiny_phase1.json")
    given = given_vocab(args)
    if given is not None:  # casing: cased text with an uncased vocabulary is ~10% [UNK], under the [UNK] check
        path, flag = given
        check_casing(path, vocab_tokens(path, flag=flag), lower_case=not args.cased, flag=flag)
    check_model_flags(args)
    check_vocab_flags(args)
    target = getattr(args, "stop_at_heldout", None)
    if target is not None and not (math.isfinite(target) and target > 0):
        raise DataError(f"--stop-at-heldout {target}: give a held-out MLM loss, a finite number > 0")
    if target is not None and getattr(args, "eval_data", None):
        raise DataError("--stop-at-heldout compares the loss on the documents held out of --data, which --eval-data "
                        "replaces: leave one of them out")
    if args.articles is not None and args.data:
        raise DataError(f"--articles {args.articles} sizes the built-in corpus, which --data replaces; leave "
                        "--articles out")
    sources = resolve(args.data, text_column=args.text_column, data_split=args.data_split) if args.data else []
    eval_paths = [path for _, path in getattr(args, "eval_data", None) or [] if path.exists()]  # missing: eval_sets
    sources += resolve(eval_paths, text_column=args.text_column, data_split=args.data_split) if eval_paths else []
    check_table_flags(args, sources)
    check_writable(args.output, flag="--output")
    if args.data_cache is not None:
        check_writable(args.data_cache, flag="--data-cache")


def given_vocab(args: Namespace) -> tuple[Path, str] | None:
    """The vocabulary the command line gives and the flag giving it: --vocab, else --init-checkpoint's vocab.txt
    (None: one is trained on the corpus)."""
    if args.vocab is not None:
        return args.vocab, "--vocab"
    if args.init_checkpoint is not None and (args.init_checkpoint / "vocab.txt").is_file():
        return args.init_checkpoint / "vocab.txt", "--init-checkpoint"
    return None


def _size_name(config: dict[str, Any]) -> str:
    dims = tuple(config.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "intermediate_size"))
    return next((name for name, size in SIZES.items() if tuple(size) == dims),
                f"hidden {dims[0]}, {dims[1]}-layer")


def check_model_flags(args: Namespace) -> None:
    """--init-checkpoint decides the model: a --model-size naming another one (once silently ignored), or
    --from-scratch beside it, is refused."""
    ckpt = args.init_checkpoint
    if ckpt is None:
        return
    if args.from_scratch:
        raise DataError(f"--from-scratch starts from random weights, but --init-checkpoint {ckpt} gives weights to "
                        "start from; pass one of the two")
    size = args.model_size
    if size is None or Path(size).resolve() == ckpt.resolve():
        return
    config = json.loads((ckpt / "config.json").read_text())
    if size not in SIZES:
        raise DataError(f"--model-size {size} and --init-checkpoint {ckpt} both name the model to train; the "
                        "checkpoint's is used, so leave --model-size out")
    if _size_name(config) != size:
        raise DataError(f"--model-size {size} does not match --init-checkpoint {ckpt}, which holds a "
                        f"{_size_name(config)} model: the checkpoint's model is the one trained. Leave --model-size "
                        "out, or give the checkpoint of a model of that size")


def check_vocab_flags(args: Namespace) -> None:
    """A --vocab beside --init-checkpoint must be the vocabulary the checkpoint learnt (same size, other tokens:
    the model's size check cannot see it); --vocab-size only sizes a trained vocabulary."""
    ckpt_vocab = args.init_checkpoint / "vocab.txt" if args.init_checkpoint is not None else None
    if args.vocab is not None and ckpt_vocab is not None and ckpt_vocab.is_file() \
            and vocab_digest(args.vocab) != vocab_digest(ckpt_vocab):
        raise DataError(f"--vocab {args.vocab} differs from {ckpt_vocab}, the vocabulary --init-checkpoint "
                        f"{args.init_checkpoint} was trained with: its token ids would stand for other words. Leave "
                        "--vocab out (the checkpoint's is used)")
    given = given_vocab(args)
    if args.vocab_size is not None and given is not None:
        raise DataError(f"--vocab-size {args.vocab_size} sizes a vocabulary trained on the corpus, but {given[1]} "
                        f"gives the vocabulary ({given[0]}); leave --vocab-size out")


def check_table_flags(args: Namespace, sources: list[Source]) -> None:
    """--data-split and --text-column choose in table inputs (of --data and --eval-data); with none there they
    would be ignored."""
    if args.data_split is not None and not any(is_dataset_dict(s.path) for s in sources):
        raise DataError(f"--data-split {args.data_split}: no --data or --eval-data input is a DatasetDict folder "
                        "(DatasetDict.save_to_disk), so there is no split to choose; leave it out")
    if args.text_column != "text" and not any(s.records for s in sources):
        raise DataError(f"--text-column {args.text_column}: no --data or --eval-data input is a table (.jsonl, "
                        ".parquet, a datasets folder), so no column is read; leave it out")


def finished_summary(out: Path, *, max_steps: int) -> dict[str, Any] | None:
    """The summary of a run in ``out`` that already finished ``max_steps`` steps (None: not finished), so a
    resume leaves its results alone; a finished run of another length is refused, not silently redone."""
    path = out / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = dict(json.loads(path.read_text()))
    except ValueError:
        logger.warning("%s is unreadable; the run is treated as unfinished", path)
        return None
    if summary.get("scheduled_steps", summary.get("steps")) != max_steps:  # scheduled: --stop-at-heldout ends early
        raise DataError(f"--resume: {out} holds a run that finished {summary.get('steps')} steps, but --max-steps "
                        f"is {max_steps}; its schedule cannot be extended. Use another --output for a new run")
    return summary


def check_fresh_output(out: Path, *, overwrite: bool) -> None:
    """Refuse to start over in a folder that holds a run's results, unless ``--overwrite`` says so (then its
    summary and checkpoints go, so a later --resume cannot mix the two runs)."""
    held = [p for p in (out / "summary.json", out / "checkpoints") if p.exists()]
    if not held:
        return
    if not overwrite:
        raise DataError(f"--output {out} already holds a run ({', '.join(p.name for p in held)}); add --resume to "
                        "continue or keep it, --overwrite to start over, or choose another --output")
    for path in held:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
