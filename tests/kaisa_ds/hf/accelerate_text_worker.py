"""Run by torchrun from test_accelerate_loop: the README's hand-written accelerate loop (DeepSpeed plugin,
``kaisa_ds.attach_to_accelerator``) training a small BertForMaskedLM on real text with a real tokenizer.

Text: WikiText-2 valid through bert_pretrain's reader (its ``@-@`` marks undone); tokenizer: the bert-base-uncased
vocabulary through bert_pretrain.data.tokenizer (the one home: size, casing and [UNK]-coverage checks). Each rank
logs the loss of every optimizer step; rank 0 writes the ranks' mean per step and what the run was built with.

On CPU ranks accelerate needs ``PartialState(cpu=True)`` before the ``Accelerator``: without it accelerate counts a
world of 1 under torchrun (``accelerate/state.py``: a CPU process group only with ``cpu=True``) while DeepSpeed
reduces over 2 ranks, so every rank trains on the whole, unsharded loader. ``cpu=True`` on the Accelerator itself
would drop DeepSpeed; the Trainer does the same for ``use_cpu=True`` (``TrainingArguments`` makes that PartialState).

Usage: torchrun --nproc_per_node 2 accelerate_text_worker.py TEXT VOCAB OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import kaisa_ds
from bert_pretrain.data.documents import read_documents
from bert_pretrain.data.tokenizer import check_coverage, check_vocab_size, count_unknown, load_tokenizer

MICRO, GAS, SEQ, STEPS, LR = 8, 2, 64, 40, 2e-3
KFAC: dict[str, Any] = {"enabled": True, "factor_update_steps": 1, "inv_update_steps": 5, "damping": 0.01,
                        "kl_clip": 0.01, "skip_layers": ["embeddings", "cls.predictions.decoder"]}  # the example's
DS_CONFIG = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS, "gradient_clipping": 1.0,
             "zero_optimization": {"stage": 0}, "kfac": KFAC}


def text_blocks(sentences: list[str], tokenizer: Any) -> list[list[int]]:
    """The text as consecutive [CLS] ... [SEP] blocks of SEQ tokens."""
    ids = [t for row in tokenizer(sentences, add_special_tokens=False)["input_ids"] for t in row]
    body = SEQ - 2
    return [[tokenizer.cls_token_id, *ids[i:i + body], tokenizer.sep_token_id]
            for i in range(0, len(ids) - body + 1, body)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("text", type=Path)
    parser.add_argument("vocab", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DeepSpeedPlugin
    from torch.utils.data import DataLoader
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        get_linear_schedule_with_warmup,
    )

    kaisa_ds.init_distributed()  # torch.distributed through DeepSpeed, as the example does (no shm op build on CPU)
    torch.manual_seed(0)
    tokenizer = load_tokenizer(args.vocab, lower_case=True, check_case=True)
    check_vocab_size(tokenizer, source=str(args.vocab))
    sentences = [s for doc in read_documents([args.text]) for s in doc]
    unknown, total = count_unknown(tokenizer, sentences)
    unk_share = check_coverage(unknown=unknown, total=total, data=str(args.text), source=str(args.vocab),
                               max_unk_rate=0.05)
    rows = text_blocks(sentences, tokenizer)[: STEPS * GAS * MICRO * int(os.environ["WORLD_SIZE"])]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    examples: Any = [{"input_ids": r} for r in rows]  # a list is a map-style dataset
    loader: Any = DataLoader(examples, batch_size=MICRO, shuffle=True, collate_fn=collator,
                             generator=torch.Generator().manual_seed(0))

    # the README's loop: a DeepSpeed plugin, prepare, then the one added line
    if not torch.cuda.is_available():  # CPU ranks: else accelerate counts a world of 1 (see the module docstring)
        PartialState(cpu=True)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=DS_CONFIG), gradient_accumulation_steps=GAS)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=256, max_position_embeddings=SEQ))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = get_linear_schedule_with_warmup(optimizer, STEPS // 10, STEPS)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    kfac = kaisa_ds.attach_to_accelerator(accelerator)
    assert kfac is not None
    window: list[float] = []
    losses: list[float] = []
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        window.append(loss.item())
        if accelerator.sync_gradients:  # an optimizer step: its micro-batches' mean loss, over the ranks
            mean = torch.tensor(sum(window) / len(window))
            losses.append(float(accelerator.reduce(mean, reduction="mean")))
            window.clear()
    if accelerator.is_main_process:
        model_vocab = accelerator.unwrap_model(model).config.vocab_size
        args.out.write_text(json.dumps({
            "losses": losses, "kfac_steps": kfac.steps, "model_vocab": model_vocab, "tokenizer_vocab": len(tokenizer),
            "unk_share": unk_share, "tokens": total, "world": accelerator.num_processes}))


if __name__ == "__main__":
    main()
