"""Causal-LM training of a small Llama-style decoder (grouped-query attention, SwiGLU MLP, RMSNorm, rotary positions)
with the Hugging Face Trainer, DeepSpeed and K-FAC (kaisa_ds). The K-FAC lines are marked ``# K-FAC``. Run it with
    deepspeed --num_gpus 2 examples/hf_trainer_causal_lm.py --deepspeed examples/ds_config_causal_lm_zero1.json \\
        --text ../shared/data/wikitext-2/valid.txt --bf16 --output runs/causal_lm
(``ds_config_causal_lm_zero2.json`` for ZeRO-2). Both configs say only ``"kfac": {"enabled": true}``: every K-FAC
setting is the library's default. Without ``--text`` it trains on generated sentences. ``--vocab FILE`` uses a given
BERT vocab.txt; otherwise a WordPiece vocabulary is learned on the text and saved as ``--output``/vocab.txt, which
``--resume`` reuses. The text, the vocabulary and their checks are examples/text_data.py's, shared with
hf_trainer_mlm.py. At the end rank 0 prints one summary line, with what K-FAC preconditioned.
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
from transformers import DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import kaisa_ds  # K-FAC


def blocks(lines: list[str], tokenizer: Any, length: int) -> Dataset:
    """The corpus as consecutive fixed-length token blocks (the labels are the blocks themselves, shifted by the
    model)."""
    ids = [t for line in lines for t in tokenizer(line, add_special_tokens=False)["input_ids"]]
    return Dataset.from_dict({"input_ids": [ids[i:i + length] for i in range(0, len(ids) - length + 1, length)]})


def decoder(vocab: int, args: argparse.Namespace) -> LlamaForCausalLM:
    """A Llama-style decoder: 32-wide heads, half as many key/value heads as query heads (grouped-query attention),
    the word embeddings tied to the LM head as small Llama models tie them."""
    heads = max(2, args.hidden // 32)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=heads,
        num_key_value_heads=heads // 2, intermediate_size=8 * args.hidden // 3, max_position_embeddings=args.seq_len,
        tie_word_embeddings=True, pad_token_id=0))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_text_flags(parser, output="runs/hf_trainer_causal_lm")
    parser.add_argument("--batch-size", type=int, default=8, help="per rank and micro-step")
    parser.add_argument("--grad-accum", type=int, default=2, help="micro-steps per optimizer step")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per block")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size (one query head per 32)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    add_run_flags(parser)
    args = parser.parse_args(argv)
    check_flags(parser, args)
    if args.seq_len < 2:
        parser.error("--seq-len must be at least 2 (a token and the one it predicts)")
    if args.hidden % 64:
        parser.error("--hidden must be a multiple of 64 (32-wide heads, half of them key/value heads)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tokenizer, dataset = prepare(args, blocks)  # checked on every rank before the ranks meet
    kaisa_ds.init_distributed()  # start torch.distributed through DeepSpeed (threads per CPU rank, no shm op build)

    model = decoder(len(tokenizer), args)
    training_args = TrainingArguments(
        output_dir=args.output, deepspeed=args.deepspeed, max_steps=args.max_steps, bf16=args.bf16,
        per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr, warmup_steps=max(1, args.max_steps // 10), weight_decay=0.01,
        logging_steps=max(1, min(10, args.max_steps // 2)), save_steps=args.save_steps,
        report_to=[], seed=0, use_cpu=not torch.cuda.is_available())  # CPU ranks: else the world size is 1
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset, data_collator=collator)
    kaisa_ds.enable_kfac(trainer)  # K-FAC: the one added line
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    trainer.save_model()
    engine: Any = trainer.model_wrapped
    kfac: Any = engine.kfac  # K-FAC: what it preconditions and how it went
    if trainer.is_world_process_zero():
        precision = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        first, last = (f"{losses[0]:.3f}", f"{losses[-1]:.3f}") if losses else ("none", "none")
        print(f"K-FAC steps {kfac.steps}, skipped windows {kfac.skipped_windows}, ZeRO stage "
              f"{engine.zero_optimization_stage()}, precision {precision}, model vocabulary {model.config.vocab_size}, "
              f"K-FAC covers {kfac.coverage.linear_share:.1%} of the linear-like parameters, first logged loss "
              f"{first}, last logged loss {last}")


if __name__ == "__main__":
    main()
