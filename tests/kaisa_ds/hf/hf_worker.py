"""Run by the deepspeed launcher (or torchrun) from the HF Trainer / accelerate tests: a tiny BertForMaskedLM trained
through ``Trainer`` + ``kaisa_ds.enable_kfac``, through a hand-written accelerate loop + ``attach_to_accelerator``,
and through ``kaisa_ds.initialize`` on the very micro-batches each rank consumed (the reference).

Usage: deepspeed --num_gpus 2 hf_worker.py SCENARIO OUT  (every rank writes OUT.rank<r>.pt)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import kaisa_ds
from tests.support.models import masked_lm_examples, tiny_bert_mlm

MICRO, GAS, LR = 4, 2, 1e-3
KFAC: dict[str, Any] = {"enabled": True, "damping": 0.01, "kl_clip": 0.05, "factor_decay": 0.9,
                        "factor_update_steps": 1, "inv_update_steps": 2}


def trainer_ds_config(*, fp16: bool = False) -> dict:
    """What a Trainer user writes: batch sizes, accumulation and clipping come from TrainingArguments ("auto")."""
    cfg: dict = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                 "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": 0},
                 "kfac": KFAC}
    if fp16:
        cfg["fp16"] = {"enabled": "auto", "initial_scale_power": 8}
    return cfg


def training_args(out: str, *, steps: int, save_steps: int = 0, fp16: bool = False) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=out, per_device_train_batch_size=MICRO, gradient_accumulation_steps=GAS, max_steps=steps,
        learning_rate=LR, max_grad_norm=1.0, logging_steps=1, report_to=[], disable_tqdm=True, seed=0, use_cpu=True,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, fp16=fp16,
        deepspeed=trainer_ds_config(fp16=fp16))


def make_trainer(args: Any, *, inject_inf_at: int | None = None) -> Any:
    from transformers import Trainer, TrainerCallback

    class Recorder(TrainerCallback):
        """Once the engine exists, wraps K-FAC's step and the optimizer's step to see the order they run in and
        the gradient norm each one sees (clipping to max_grad_norm happens between them)."""

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            engine = trainer.model_wrapped
            kfac_step, optimizer_step = engine.kfac.step, engine.optimizer.step

            def norm() -> float:
                grads = [p.grad.float() for p in engine.module.parameters() if p.grad is not None]
                return float(torch.sqrt(sum((g**2).sum() for g in grads)))

            def recording_kfac_step() -> None:
                kfac_step()
                trainer.record["events"].append(("kfac", norm()))

            def recording_optimizer_step(*args: Any, **kwargs: Any) -> Any:
                trainer.record["events"].append(("optimizer", norm()))
                return optimizer_step(*args, **kwargs)

            engine.kfac.step = recording_kfac_step
            engine.optimizer.step = recording_optimizer_step

    class RecordingTrainer(Trainer):
        """The user's Trainer, plus a record of each rank's micro-batches and losses (and an optional inf)."""

        def training_step(self, model: Any, inputs: dict, num_items_in_batch: Any = None) -> torch.Tensor:
            self.record["batches"].append({k: v.clone() for k, v in inputs.items()})
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.record["losses"].append(float(loss))
            return loss

        def compute_loss(self, model: Any, inputs: dict, *args: Any, **kwargs: Any) -> Any:
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            window = (len(self.record["batches"]) - 1) // GAS
            if inject_inf_at == window and int(os.environ["RANK"]) == 1:
                loss = loss * float("inf")  # an fp16 overflow on one rank
            return loss

    trainer = RecordingTrainer(model=tiny_bert_mlm(), args=args, train_dataset=masked_lm_examples(64),
                               callbacks=[Recorder()])
    trainer.record = {"batches": [], "losses": [], "events": []}
    kaisa_ds.enable_kfac(trainer)  # the one line a user adds
    return trainer


def window_losses(micro_losses: list[float], per_window: int = 1) -> list[float]:
    """Per optimizer step: the sum of the micro-batch losses of the window, averaged over ranks."""
    from deepspeed import comm as dist

    t = torch.tensor([sum(micro_losses[i:i + per_window]) for i in range(0, len(micro_losses), per_window)])
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def factors(kfac: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {n: (ly.a_factor.float().clone(), ly.g_factor.float().clone()) for n, ly in kfac.layers.items()
            if ly.a_factor is not None and ly.g_factor is not None}


def trainer_result(trainer: Any) -> dict:
    engine = trainer.model_wrapped
    rec = trainer.record
    return {"losses": window_losses(rec["losses"], GAS), "factors": factors(engine.kfac),
            "kfac_steps": engine.kfac.steps,
            "batches": rec["batches"], "events": rec["events"],
            "optimizer_is_trainers": engine.optimizer is trainer.optimizer.optimizer,
            "optimizer": type(engine.optimizer).__name__, "skipped_windows": engine.kfac.skipped_windows,
            "skipped_steps": engine.skipped_steps, "ds_gas": engine.gradient_accumulation_steps()}


def adamw(model: Any) -> torch.optim.Optimizer:
    """The Trainer's default optimizer with these TrainingArguments (adamw_torch_fused, lr 1e-3)."""
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=True)


def rank_batches(steps: int) -> list[dict]:
    """This rank's micro-batches for `steps` windows, cut from the same examples the Trainer gets."""
    from deepspeed import comm as dist

    examples, rank, world = masked_lm_examples(64), dist.get_rank(), dist.get_world_size()
    batches = []
    for i in range(steps * GAS):
        first = (i * world + rank) * MICRO
        chunk = examples[first:first + MICRO]
        batches.append({k: torch.stack([e[k] for e in chunk]) for k in chunk[0]})
    return batches


def reference(batches: list[dict], steps: int) -> dict:
    """kaisa_ds.initialize on the same model seed, micro-batches and settings (AdamW, linear schedule, clip 1.0)."""
    from transformers import get_linear_schedule_with_warmup

    model = tiny_bert_mlm()
    optimizer = adamw(model)
    schedule = get_linear_schedule_with_warmup(optimizer, 0, steps)
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": 0}, "kfac": KFAC}
    engine, *_ = kaisa_ds.initialize(model=model, optimizer=optimizer, lr_scheduler=schedule, config=cfg)
    losses = []
    for batch in batches:
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss) / GAS)
    return {"losses": window_losses(losses, GAS), "factors": factors(engine.kfac), "kfac_steps": engine.kfac.steps}


def accelerate_loop(batches: list[dict], steps: int) -> dict:
    """A hand-written accelerate loop with a DeepSpeed plugin, on the given micro-batches."""
    from accelerate import Accelerator, PartialState
    from accelerate.utils import DeepSpeedPlugin
    from transformers import get_linear_schedule_with_warmup

    PartialState(cpu=True)  # CPU ranks: else accelerate counts a world of 1 (attach_to_accelerator refuses that)

    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": 0}, "kfac": KFAC}
    # step_scheduler_with_optimizer=False: by default accelerate steps a prepared scheduler once per process on
    # each optimizer step (its convention for schedules sized for one process); the reference steps it once
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=cfg), gradient_accumulation_steps=GAS,
                              step_scheduler_with_optimizer=False)
    model = tiny_bert_mlm()
    optimizer = adamw(model)
    schedule = get_linear_schedule_with_warmup(optimizer, 0, steps)
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    kfac = kaisa_ds.attach_to_accelerator(accelerator)  # the one line a user adds
    losses = []
    for batch in batches:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            if accelerator.sync_gradients:
                schedule.step()
            optimizer.zero_grad()
        losses.append(float(loss) / GAS)
    return {"losses": window_losses(losses, GAS), "factors": factors(kfac), "kfac_steps": kfac.steps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["compare", "resume", "overflow", "accelerate"])
    parser.add_argument("out")
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    from deepspeed.accelerator import get_accelerator

    get_accelerator().is_fp16_supported = lambda: True  # CPU: lift DeepSpeed's fp16 refusal (overflow test)
    from kaisa_ds.engine.launch import init_distributed

    rank, _ = init_distributed()
    work = f"{args.out}.work"
    results: dict = {}
    if args.scenario == "compare":
        targs = training_args(work, steps=3)
        trainer = make_trainer(targs)
        trainer.train()
        results["trainer"] = trainer_result(trainer)
        results["reference"] = reference(results["trainer"]["batches"], 3)
        results["trainer_optimizer"] = repr(trainer.optimizer.optimizer.defaults)
    elif args.scenario == "resume":
        full = make_trainer(training_args(work, steps=4, save_steps=2))
        full.train()
        results["full"] = trainer_result(full)
        resumed = make_trainer(training_args(work + "-resumed", steps=4))
        resumed.train(resume_from_checkpoint=os.path.join(work, "checkpoint-2"))
        results["resumed"] = trainer_result(resumed)
        results["checkpoint"] = os.path.join(work, "checkpoint-2")
    elif args.scenario == "overflow":
        trainer = make_trainer(training_args(work, steps=3, fp16=True), inject_inf_at=1)
        trainer.train()
        results["trainer"] = trainer_result(trainer)
    elif args.scenario == "accelerate":
        batches = rank_batches(3)
        results["accelerate"] = accelerate_loop(batches, 3)
        results["reference"] = reference(batches, 3)
    torch.save(results, f"{args.out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
