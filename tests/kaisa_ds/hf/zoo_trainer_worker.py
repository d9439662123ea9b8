"""Run by the deepspeed launcher from test_zoo_trainer.py: zoo families (tests/support/zoo.py) trained through the HF
Trainer + DeepSpeed with ``"kfac": {"enabled": true}`` and nothing else set, on WikiText-2 blocks.

Usage: deepspeed --num_gpus 2 zoo_trainer_worker.py OUT FAMILY [FAMILY ...]   (rank 0 writes OUT, JSON)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import torch

import kaisa_ds

STEPS, MICRO, GAS = 24, 4, 2


def train(family: str, out: str) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from tests.support.zoo import FAMILIES, batch

    spec = FAMILIES[family]
    torch.manual_seed(0)
    model = spec.build()
    rows = [batch(spec.task, size=1, offset=i) for i in range(64)]
    data = Dataset.from_list([{k: v[0].tolist() for k, v in row.items()} for row in rows])
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": 1},
          "kfac": {"enabled": True}}
    args = TrainingArguments(output_dir=f"{out}.{family}", per_device_train_batch_size=MICRO,
                             gradient_accumulation_steps=GAS, max_steps=STEPS, learning_rate=3e-3, warmup_steps=2,
                             logging_steps=1, report_to=[], disable_tqdm=True, seed=0, use_cpu=True,
                             save_strategy="no", deepspeed=ds)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    kaisa_ds.enable_kfac(trainer)
    trainer.train()
    kfac = trainer.model_wrapped.kfac
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"losses": losses, "kfac_steps": kfac.steps, "coverage": kfac.coverage.summary(),
            "zero_stage": trainer.model_wrapped.zero_optimization_stage()}


def main() -> None:
    out, *families = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher adds it
    results = {family: train(family, out) for family in families}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
