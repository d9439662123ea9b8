"""Masked-LM training of a small BERT with the Hugging Face Trainer, DeepSpeed and K-FAC (kaisa_ds).

The script is an ordinary Trainer script; the K-FAC lines are marked ``# K-FAC``. Run it with
    deepspeed --num_gpus 2 examples/hf_trainer_mlm.py --deepspeed examples/ds_config_kfac.json --output runs/hf
    torchrun --nproc_per_node 2 examples/hf_trainer_mlm.py --deepspeed examples/ds_config_kfac.json --output runs/hf
and give it a corpus with ``--text FILE`` (one document or sentence per line; e.g. WikiText-2); without one it
trains on generated sentences. ``--vocab FILE`` uses a given BERT vocab.txt; otherwise a WordPiece vocabulary is
learned on the text (deterministically) and saved as ``--output``/vocab.txt. ``--resume`` continues from the newest
checkpoint in ``--output`` and reuses the vocabulary saved there (a different one would change the token ids).

The script stays standalone but builds its tokenizer with ``bert_pretrain.data.tokenizer`` (the one home for it):
``BertTokenizerFast(vocab_file=...)`` is silently ignored by transformers 5 (a 5-token, all-[UNK] tokenizer), and
the helpers refuse a vocabulary too small for the text or one that turns the text into [UNK].

Every flag is used or refused before a rank starts: too little --text for one optimizer step, --vocab-size with
--vocab, --cased with an uncased vocabulary (also the one a --resume reuses). Batch size, accumulation and --bf16
reach DeepSpeed through the Trainer: a config value other than "auto" must equal the flag's (the Trainer refuses a
mismatch), and the summary line names the precision the engine ran in.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

# bert_pretrain (the tokenizer's home) is not part of the kaisa_ds wheel: it is imported from this checkout, whose
# root a launcher running this file by path does not put on sys.path (torchrun; the deepspeed launcher adds the
# working directory only)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from datasets import Dataset
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

import kaisa_ds  # K-FAC
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


def generated_lines(count: int = 2000, seed: int = 0) -> list[str]:
    """Sentences with some structure to learn, for a run without a corpus."""
    rng = random.Random(seed)
    things = ["river", "castle", "engine", "garden", "library", "harbour", "forest", "market"]
    verbs = ["crosses", "guards", "powers", "borders", "holds", "faces", "shelters", "feeds"]
    return [f"the {rng.choice(things)} {rng.choice(verbs)} the {rng.choice(things)} near the "
            f"{rng.choice(things)} in {rng.randint(1800, 2000)} ." for _ in range(count)]


def blocks(lines: list[str], tokenizer: Any, length: int) -> Dataset:
    """The corpus as consecutive fixed-length token blocks, each wrapped in [CLS] ... [SEP]."""
    ids = [t for line in lines for t in tokenizer(line, add_special_tokens=False)["input_ids"]]
    body = length - 2
    rows = [[tokenizer.cls_token_id, *ids[i:i + body], tokenizer.sep_token_id]
            for i in range(0, len(ids) - body + 1, body)]
    return Dataset.from_dict({"input_ids": rows})


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deepspeed", required=True, help="DeepSpeed JSON with a \"kfac\" section")
    parser.add_argument("--output", default="runs/hf_trainer_mlm")
    parser.add_argument("--text", type=Path, help="training text, one line per document or sentence")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank and micro-step (the config's "
                        "train_micro_batch_size_per_gpu: \"auto\" or this value)")
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-steps per optimizer step (the config's "
                        "gradient_accumulation_steps: \"auto\" or this value)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per block, [CLS] and [SEP] included")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size (one attention head per 64)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--save-steps", type=int, default=100, help="checkpoint every N steps (and at the end)")
    parser.add_argument("--vocab", type=Path, help="a BERT vocab.txt (default: learn one on the text)")
    parser.add_argument("--vocab-size", type=int, help=f"size of the vocabulary learned without --vocab (default: "
                        f"{VOCAB_SIZE}; a small text gives fewer)")
    parser.add_argument("--cased", action="store_true", help="keep capitals (a cased --vocab needs it)")
    parser.add_argument("--bf16", action="store_true", help="bf16 through DeepSpeed (the config's bf16.enabled: "
                        "\"auto\", true or absent)")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    args = parser.parse_args(argv)
    if args.vocab is not None and args.vocab_size is not None:
        parser.error("--vocab-size applies to a vocabulary learned on the text; with --vocab the file's size is "
                     "used: leave one of them out")
    for flag in ("max_steps", "batch_size", "grad_accum", "hidden", "layers", "save_steps"):  # 0 steps: 3 epochs
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.seq_len < 3:
        parser.error("--seq-len must be at least 3 ([CLS], one token, [SEP])")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:  # the text and the vocabulary are checked on every rank before the ranks meet
        lines = read_lines(args.text) if args.text is not None else generated_lines()
        tokenizer = build_tokenizer(args, lines)
        dataset = blocks(lines, tokenizer, args.seq_len)
        check_blocks(len(dataset), args, world=int(os.environ.get("WORLD_SIZE", "1")))
    except DataError as exc:
        raise SystemExit(f"error: {exc}") from exc
    kaisa_ds.init_distributed()  # start torch.distributed through DeepSpeed (threads per CPU rank, no shm op build)

    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=args.hidden,
                                       num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                                       intermediate_size=4 * args.hidden, max_position_embeddings=args.seq_len))
    training_args = TrainingArguments(
        output_dir=args.output, deepspeed=args.deepspeed, max_steps=args.max_steps, bf16=args.bf16,
        per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=args.grad_accum,
        learning_rate=1e-3, warmup_steps=max(1, args.max_steps // 10),
        logging_steps=max(1, min(10, args.max_steps // 2)), save_steps=args.save_steps,
        report_to=[], seed=0, use_cpu=not torch.cuda.is_available())  # CPU ranks: else the world size is 1
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset, data_collator=collator)
    kaisa_ds.enable_kfac(trainer)  # K-FAC: the one added line
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    trainer.save_model()
    engine: Any = trainer.model_wrapped
    kfac: Any = engine.kfac  # K-FAC: what a tuner reads
    if trainer.is_world_process_zero():
        precision = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        print(f"K-FAC steps {kfac.steps}, skipped windows {kfac.skipped_windows}, model vocabulary "
              f"{model.config.vocab_size}, precision {precision}, first logged loss {losses[0]:.3f}, last logged "
              f"loss {losses[-1]:.3f}" if losses else f"K-FAC steps {kfac.steps}, no loss logged")


if __name__ == "__main__":
    main()
