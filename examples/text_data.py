"""Text and vocabulary for the Trainer examples (hf_trainer_mlm.py, hf_trainer_causal_lm.py): their --text read
as sentences, the tokenizer learned on it or given (and reused on --resume), and the refusal of text that does not
fill one optimizer step. Every check runs on every rank before the ranks meet.

The tokenizer is built with ``bert_pretrain.data.tokenizer`` (the one home for it):
``BertTokenizerFast(vocab_file=...)`` is silently ignored by transformers 5 (a 5-token, all-[UNK] tokenizer), and the
helpers refuse a vocabulary too small for the text or one that turns the text into [UNK].
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# bert_pretrain is not part of the kaisa_ds wheel: it is imported from this checkout, whose root a launcher running
# an example by path does not put on sys.path (torchrun; the deepspeed launcher adds the working directory only)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bert_pretrain.data.documents import read_documents
from bert_pretrain.data.errors import DataError
from bert_pretrain.data.tokenizer import (
    check_coverage,
    check_vocab_size,
    count_unknown,
    load_tokenizer,
    train_vocab,
    vocab_digest,
)

__all__ = ["VOCAB_SIZE", "DataError", "add_run_flags", "add_text_flags", "build_tokenizer", "check_blocks",
           "check_flags", "generated_lines", "prepare", "read_lines"]


def generated_lines(count: int = 2000, seed: int = 0) -> list[str]:
    """Sentences with some structure to learn, for a run without a corpus."""
    rng = random.Random(seed)
    things = ["river", "castle", "engine", "garden", "library", "harbour", "forest", "market"]
    verbs = ["crosses", "guards", "powers", "borders", "holds", "faces", "shelters", "feeds"]
    return [f"the {rng.choice(things)} {rng.choice(verbs)} the {rng.choice(things)} near the "
            f"{rng.choice(things)} in {rng.randint(1800, 2000)} ." for _ in range(count)]


def read_lines(path: Path) -> list[str]:
    """The sentences of --text (WikiText's @-@ marks undone by bert_pretrain's reader, the one home for them). Its
    errors name bert_pretrain's flag, --data; here the file came from --text."""
    try:
        return [sentence for doc in read_documents([path]) for sentence in doc]
    except DataError as exc:
        raise DataError(re.sub(r"^--data\b", "--text", str(exc))) from exc


def check_blocks(count: int, args: argparse.Namespace, *, world: int) -> None:
    """Refuse text that does not fill one optimizer step (the Trainer would repeat the few blocks it has)."""
    step = args.batch_size * args.grad_accum * world
    if count < step:
        raise DataError(f"--text {args.text or '(generated)'}: {count} blocks of --seq-len {args.seq_len} tokens, but "
                        f"one optimizer step takes --batch-size {args.batch_size} x --grad-accum {args.grad_accum} x "
                        f"{world} rank(s) = {step}; give more text, or lower --seq-len, --batch-size or --grad-accum")


def build_tokenizer(args: argparse.Namespace, lines: list[str]) -> Any:
    """The tokenizer of this run, saved as --output/vocab.txt; a --resume reuses the saved one (a vocabulary learned
    or given again could have other ids than the checkpoint's embeddings) and refuses a --vocab that differs."""
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "vocab.txt"
    lower = not args.cased
    learned = False
    if args.resume and saved.is_file():
        if args.vocab is not None and vocab_digest(args.vocab) != vocab_digest(saved):
            raise DataError(f"--vocab {args.vocab} differs from {saved}, the vocabulary the checkpoint was trained "
                            "with; resume without --vocab (or with that file), or start a new --output")
        if args.vocab_size is not None:
            print(f"--resume reuses {saved}; --vocab-size {args.vocab_size} applies only to a new vocabulary")
        vocab = saved
    elif args.vocab is not None:
        vocab = args.vocab
        if vocab.resolve() != saved.resolve():
            saved.write_bytes(vocab.read_bytes())
    else:
        vocab = train_vocab([lines], out, vocab_size=args.vocab_size or VOCAB_SIZE, lower_case=lower)
        learned = True
    # a given or reused vocabulary must match --cased (a learned one follows it)
    tokenizer = load_tokenizer(vocab, lower_case=lower, check_case=not learned)
    check_vocab_size(tokenizer, source=str(vocab))
    unknown, total = count_unknown(tokenizer, lines)
    share = check_coverage(unknown=unknown, total=total, data=str(args.text or "generated text"), source=str(vocab),
                           max_unk_rate=0.05, rate_flag="(the example's limit)")
    print(f"vocabulary {vocab}: {len(tokenizer)} tokens, [UNK] {share:.2%} of {total} tokens")
    return tokenizer


VOCAB_SIZE = 4000  # of a vocabulary learned on the text


def add_text_flags(parser: argparse.ArgumentParser, *, output: str) -> None:
    """The flags both examples open with: the DeepSpeed JSON, where the run goes, its text and its length."""
    parser.add_argument("--deepspeed", required=True, help="DeepSpeed JSON with a \"kfac\" section")
    parser.add_argument("--output", default=output)
    parser.add_argument("--text", type=Path, help="training text, one line per document or sentence")
    parser.add_argument("--max-steps", type=int, default=200)


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags both examples end with: checkpoints, the vocabulary, bf16, resume and the launcher's rank."""
    parser.add_argument("--save-steps", type=int, default=100, help="checkpoint every N steps (and at the end)")
    parser.add_argument("--vocab", type=Path, help="a BERT vocab.txt (default: learn one on the text)")
    parser.add_argument("--vocab-size", type=int, help=f"size of the vocabulary learned without --vocab (default: "
                        f"{VOCAB_SIZE}; a small text gives fewer)")
    parser.add_argument("--cased", action="store_true", help="keep capitals (a cased --vocab needs it)")
    parser.add_argument("--bf16", action="store_true", help="bf16 through DeepSpeed (the config's bf16.enabled: "
                        "\"auto\", true or absent)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The flags both examples share: counts of at least 1, and --vocab or --vocab-size, not both."""
    if args.vocab is not None and args.vocab_size is not None:
        parser.error("--vocab-size applies to a vocabulary learned on the text; with --vocab the file's size is "
                     "used: leave one of them out")
    for flag in ("max_steps", "batch_size", "grad_accum", "hidden", "layers", "save_steps"):  # 0 steps: 3 epochs
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")


def prepare(args: argparse.Namespace, make_blocks: Callable[[list[str], Any, int], Any]) -> tuple[Any, Any]:
    """The tokenizer and the dataset of --text (or generated sentences), checked on every rank before the ranks meet:
    a problem exits naming the flag."""
    try:
        lines = read_lines(args.text) if args.text is not None else generated_lines()
        tokenizer = build_tokenizer(args, lines)
        dataset = make_blocks(lines, tokenizer, args.seq_len)
        check_blocks(len(dataset), args, world=int(os.environ.get("WORLD_SIZE", "1")))
    except DataError as exc:
        raise SystemExit(f"error: {exc}") from exc
    return tokenizer, dataset
