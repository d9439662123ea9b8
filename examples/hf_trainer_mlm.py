"""Masked-LM training of a small BERT with the Hugging Face Trainer, DeepSpeed and K-FAC (kaisa_ds).

The script is an ordinary Trainer script; the K-FAC lines are marked ``# K-FAC``. Run it with
    deepspeed --num_gpus 2 examples/hf_trainer_mlm.py --deepspeed examples/ds_config_kfac.json --output runs/hf
    torchrun --nproc_per_node 2 examples/hf_trainer_mlm.py --deepspeed examples/ds_config_kfac.json --output runs/hf
and give it a corpus with ``--text FILE`` (one document or sentence per line; e.g. WikiText-2); without one it
trains on generated sentences. ``--vocab FILE`` uses a given BERT vocab.txt; otherwise a WordPiece vocabulary is
learned on the text (deterministically) and saved as ``--output``/vocab.txt. ``--resume`` continues from the newest
checkpoint in ``--output`` and reuses the vocabulary saved there (a different one would change the token ids).

Its text, vocabulary and their checks are examples/text_data.py's, shared with hf_trainer_causal_lm.py.

Every flag is used or refused before a rank starts: too little --text for one optimizer step, --vocab-size with
--vocab, --cased with an uncased vocabulary (also the one a --resume reuses). Batch size, accumulation and --bf16
reach DeepSpeed through the Trainer: a config value other than "auto" must equal the flag's (the Trainer refuses a
mismatch), and the summary line names the precision the engine ran in.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # text_data, beside this file (also when loaded by path)

import torch
from datasets import Dataset
from text_data import add_run_flags, add_text_flags, check_flags, prepare
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

import kaisa_ds  # K-FAC


def blocks(lines: list[str], tokenizer: Any, length: int) -> Dataset:
    """The corpus as consecutive fixed-length token blocks, each wrapped in [CLS] ... [SEP]."""
    ids = [t for line in lines for t in tokenizer(line, add_special_tokens=False)["input_ids"]]
    body = length - 2
    rows = [[tokenizer.cls_token_id, *ids[i:i + body], tokenizer.sep_token_id]
            for i in range(0, len(ids) - body + 1, body)]
    return Dataset.from_dict({"input_ids": rows})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_text_flags(parser, output="runs/hf_trainer_mlm")
    parser.add_argument("--batch-size", type=int, default=8, help="per rank and micro-step (the config's "
                        "train_micro_batch_size_per_gpu: \"auto\" or this value)")
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-steps per optimizer step (the config's "
                        "gradient_accumulation_steps: \"auto\" or this value)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per block, [CLS] and [SEP] included")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size (one attention head per 64)")
    parser.add_argument("--layers", type=int, default=2)
    add_run_flags(parser)
    args = parser.parse_args(argv)
    check_flags(parser, args)
    if args.seq_len < 3:
        parser.error("--seq-len must be at least 3 ([CLS], one token, [SEP])")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tokenizer, dataset = prepare(args, blocks)  # checked on every rank before the ranks meet
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
