"""Named evaluation texts (``--eval-data NAME=FILE``): extra held-out sets kept apart from the training text.

A benchmark that tunes hyperparameters on one text and reports on another needs both evaluated by the same code
that trains. Each named file is prepared like the training data but with the training vocabulary and a fixed
seed and copy count, so every run (whatever its ``--seed``) is evaluated on exactly the same examples; all of
the file's documents are evaluation text. Metrics come out as ``heldout_<NAME>_mlm_loss`` and so on.
"""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Any

from bert_pretrain.data.documents import DataError
from bert_pretrain.data.tokenizer import MAX_UNK_RATE

logger = logging.getLogger(__name__)
EVAL_SEED = 12345  # masks and pairings of evaluation examples: the same for every run
EVAL_DUPE_FACTOR = 2  # masked copies of each evaluation document
NAME = re.compile(r"^[A-Za-z0-9_]+$")


def named_text(value: str) -> tuple[str, Path]:
    """argparse type of ``--eval-data``: ``NAME=FILE`` with NAME of letters, digits and underscores."""
    name, sep, path = value.partition("=")
    if not sep or not NAME.match(name) or not path:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=FILE, NAME of letters, digits and '_' "
                                         "(e.g. report=../parts/report.txt)")
    return name, Path(path)


def folder(cache: Path, name: str) -> Path:
    """Where the evaluation set ``name`` is prepared (below the run's data cache)."""
    return cache / "eval" / name


def prepare(texts: list[tuple[str, Path]], cache: Path, *, phase: int, lower_case: bool, doc_split: str,
            max_seq_length: int | None, max_predictions: int | None, text_column: str = "text",
            data_split: str | None = None, encoding: str = "utf-8", max_unk_rate: float = MAX_UNK_RATE,
            ) -> dict[str, Path]:
    """Prepare each named text (any ``--data`` format, read with the same ``--text-column``/``--data-split``/
    ``--encoding`` and held to the same ``--max-unk-rate``) with the training vocabulary ``cache/vocab.txt``;
    returns its phase folders. A refusal names the set."""
    from bert_pretrain.data.prepare import prepare_phase

    names = [n for n, _ in texts]
    if len(set(names)) != len(names):
        raise DataError(f"--eval-data: names must differ, got {' '.join(names)}")
    out = {}
    for name, path in texts:
        if not path.exists():
            raise DataError(f"--eval-data: {path} (set {name!r}) does not exist; check the path")
        try:
            out[name] = prepare_phase([path], folder(cache, name), phase=phase, vocab=cache / "vocab.txt",
                                      lower_case=lower_case, dupe_factor=EVAL_DUPE_FACTOR, seed=EVAL_SEED,
                                      max_seq_length=max_seq_length, max_predictions=max_predictions,
                                      doc_split=doc_split, text_column=text_column, data_split=data_split,
                                      encoding=encoding, max_unk_rate=max_unk_rate)
        except DataError as exc:  # its messages say --data: the set is named here
            raise DataError(f"--eval-data {name}={path}: {exc}") from exc
    return out


def load(phase_folder: Path) -> Any:
    """Every example of a prepared evaluation text (its own train and held-out documents alike)."""
    from datasets import concatenate_datasets

    from bert_pretrain.data.loader import load_split

    parts = [load_split(phase_folder, part) for part in ("train", "heldout")]
    return concatenate_datasets([p.with_format(None) for p in parts]).with_format("torch")


def prepare_on_rank0(args: Any, cache: Path, rank: int) -> dict[str, Any]:
    """Rank 0 prepares the ``--eval-data`` sets (after the training data); every rank loads them, or gets the
    same DataError."""
    import torch.distributed as tdist

    if not getattr(args, "eval_data", None):
        return {}
    outcome: list[Any] = [None]
    if rank == 0:
        try:
            outcome[0] = {k: str(v) for k, v in prepare(
                args.eval_data, cache, phase=args.phase, lower_case=not args.cased, doc_split=args.doc_split,
                max_seq_length=args.max_seq_length, max_predictions=args.max_predictions,
                text_column=args.text_column, data_split=args.data_split, encoding=args.encoding,
                max_unk_rate=args.max_unk_rate).items()}
        except DataError as exc:
            outcome[0] = exc
    tdist.broadcast_object_list(outcome, src=0)
    if isinstance(outcome[0], DataError):
        raise outcome[0]
    return {name: load(Path(path)) for name, path in outcome[0].items()}


def renamed(metrics: dict[str, float], name: str) -> dict[str, float]:
    """``heldout_mlm_loss`` → ``heldout_<name>_mlm_loss`` (and the same for every metric)."""
    return {k.replace("heldout_", f"heldout_{name}_", 1): v for k, v in metrics.items()}

