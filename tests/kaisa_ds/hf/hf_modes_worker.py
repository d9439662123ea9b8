"""Run by the deepspeed launcher from test_hf_trainer_modes.py: the HF Trainer + ``kaisa_ds.enable_kfac`` as Trainer
users run it (issue 22), several Trainer runs per launch (each launch costs ~20 s of start-up on 2 CPU ranks).

Usage: deepspeed --num_gpus 2 hf_modes_worker.py GROUP OUT  (every rank writes OUT.rank<r>.pt)
Groups: ``core`` (loss conventions, reporting, an overflow outside K-FAC's layers, misuse), ``modes`` (slow).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import kaisa_ds
from tests.kaisa_ds.hf.hf_worker import GAS, KFAC, LR, MICRO, factors, window_losses
from tests.support.models import masked_lm_examples, tiny_bert_mlm

MESSAGES: list[str] = []  # kaisa_ds log records of this rank


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        MESSAGES.append(record.getMessage())


def ds_config(*, kfac: dict | None = KFAC, fp16: bool = False, bf16: bool = False, stage: int = 0,
              extra: dict | None = None) -> dict:
    cfg: dict = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                 "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": stage}}
    if kfac is not None:
        cfg["kfac"] = kfac
    if fp16:
        cfg["fp16"] = {"enabled": "auto", "initial_scale_power": 8}
    if bf16:
        cfg["bf16"] = {"enabled": "auto"}
    return {**cfg, **(extra or {})}


def args_for(out: str, cfg: dict, *, steps: int = 3, **overrides: Any) -> Any:
    from transformers import TrainingArguments

    base: dict[str, Any] = dict(
        output_dir=out, per_device_train_batch_size=MICRO, gradient_accumulation_steps=GAS, max_steps=steps,
        learning_rate=LR, max_grad_norm=1.0, logging_steps=1, report_to=[], disable_tqdm=True, seed=0, use_cpu=True,
        save_strategy="no", deepspeed=cfg)
    base.update(overrides)
    return TrainingArguments(**base)


class LossRecorder:
    """A TrainerCallback-free record of each micro-batch's loss (the Trainer's training_step return)."""

    @staticmethod
    def trainer_class() -> Any:
        from transformers import Trainer

        class RecordingTrainer(Trainer):
            micro_losses: list[float]

            def training_step(self, model: Any, inputs: dict, num_items_in_batch: Any = None) -> torch.Tensor:
                loss = super().training_step(model, inputs, num_items_in_batch)
                self.micro_losses.append(float(loss))
                return loss

        return RecordingTrainer


def build(args: Any, *, model: Any = None, loss_func: Callable[..., Any] | None = None, enable: bool = True,
          examples: int = 64, **kwargs: Any) -> Any:
    trainer = LossRecorder.trainer_class()(model=model if model is not None else tiny_bert_mlm(), args=args,
                                           train_dataset=masked_lm_examples(examples), compute_loss_func=loss_func,
                                           **kwargs)
    trainer.micro_losses = []
    if enable:
        kaisa_ds.enable_kfac(trainer)
    return trainer


def summary(trainer: Any, initial: dict[str, torch.Tensor]) -> dict:
    engine = trainer.model_wrapped
    kfac = getattr(engine, "kfac", None)
    return {"losses": window_losses(trainer.micro_losses, GAS),
            "update": {n: (p.detach().float() - initial[n]).clone() for n, p in engine.module.named_parameters()
                       if n in initial},
            "factors": factors(kfac) if kfac is not None else {}, "kfac_steps": kfac.steps if kfac else None,
            "skipped_windows": kfac.skipped_windows if kfac else None, "skipped_steps": engine.skipped_steps,
            "logged": [e["loss"] for e in trainer.state.log_history if "loss" in e]}


def run(trainer: Any, **train_kwargs: Any) -> dict:
    initial = {n: p.detach().float().clone() for n, p in trainer.model.named_parameters()}
    trainer.train(**train_kwargs)
    return summary(trainer, initial)


def mean_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """The common compute_loss_func: the micro-batch mean, ignoring num_items_in_batch."""
    logits = outputs.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def token_normalised_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """The Trainer's own convention: the sum over labelled tokens divided by num_items_in_batch."""
    logits = outputs.logits
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                            reduction="sum")
    return total / num_items_in_batch


def skipped_layer_overflow(work: str, *, stage: int) -> dict:
    """fp16, embeddings skipped by K-FAC, an inf only in the position embeddings' gradient on rank 1 in window 1."""
    skip = {**KFAC, "skip_layers": ["embeddings"]}
    trainer = build(args_for(f"{work}-fp16-z{stage}", ds_config(kfac=skip, fp16=True, stage=stage), steps=4,
                             fp16=True))
    rank, calls = int(os.environ["RANK"]), {"n": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return grad * float("inf") if rank == 1 and (calls["n"] - 1) // GAS == 1 else grad

    trainer.model.bert.embeddings.position_embeddings.weight.register_hook(poison)  # not tied to a K-FAC layer
    result = run(trainer)
    result["kfac_layers"] = sorted(trainer.model_wrapped.kfac.layers)
    return result


def core(work: str) -> dict:
    """Loss conventions (item 1), K-FAC reporting (6), an overflow outside K-FAC's layers (9), misuse (3/11)."""
    res: dict = {}
    csv = {"csv_monitor": {"enabled": True, "output_path": work + "-csv", "job_name": "kfac"}}
    res["own"] = run(build(args_for(work + "-own", ds_config(extra=csv))))
    res["mean_func"] = run(build(args_for(work + "-mean", ds_config()), loss_func=mean_loss))
    res["normalised_func"] = run(build(args_for(work + "-norm", ds_config()), loss_func=token_normalised_loss))
    res["csv"] = work + "-csv"

    res["skipped_layer_overflow"] = skipped_layer_overflow(work, stage=0)
    # misuse: twice, after train(), a config whose kfac section is disabled, a new Accelerator (hp search's trial)
    MESSAGES.clear()
    trainer = build(args_for(work + "-twice", ds_config(), steps=2))
    kaisa_ds.enable_kfac(trainer)
    res["twice_messages"] = list(MESSAGES)
    run(trainer)
    try:
        kaisa_ds.enable_kfac(trainer)
        res["after_train"] = "no error"
    except ValueError as exc:
        res["after_train"] = str(exc)
    from transformers.trainer_utils import HPSearchBackend

    search = LossRecorder.trainer_class()(model_init=lambda: tiny_bert_mlm(), train_dataset=masked_lm_examples(64),
                                          args=args_for(work + "-hp", ds_config(), steps=2))
    kaisa_ds.enable_kfac(search)
    search.hp_search_backend = HPSearchBackend.RAY  # what hyperparameter_search sets: a new Accelerator per trial
    res["trials"] = []
    for lr in (LR, LR / 2):
        search.micro_losses = []
        search._hp_search_setup({"learning_rate": lr})  # hyperparameter_search's per-trial setup (ray's dict trial)
        search.train()
        res["trials"].append(getattr(search.model_wrapped, "kfac", None) is not None
                             and search.model_wrapped.kfac.steps == 2)
    try:
        build(args_for(work + "-compile", ds_config(), torch_compile=True))
        res["compile"] = "no error"
    except ValueError as exc:
        res["compile"] = str(exc)
    MESSAGES.clear()
    disabled = build(args_for(work + "-off", ds_config(kfac={"enabled": False}), steps=2))
    res["disabled_messages"] = list(MESSAGES)
    plain = build(args_for(work + "-plain", ds_config(kfac=None), steps=2), enable=False)
    res["accepts_loss_kwargs"] = (disabled.model_accepts_loss_kwargs, plain.model_accepts_loss_kwargs)
    res["disabled"] = run(disabled)
    return res


class LoRALinear(torch.nn.Module):
    """A frozen base Linear plus a trainable low-rank adapter (what PEFT's LoRA builds), by hand."""

    def __init__(self, base: torch.nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_a = torch.nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = torch.nn.Linear(rank, base.out_features, bias=False)
        torch.nn.init.normal_(self.lora_b.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x))


def lora_model() -> torch.nn.Module:
    model = tiny_bert_mlm()
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.bert.encoder.layer:
        attention = layer.attention.self
        attention.query, attention.value = LoRALinear(attention.query), LoRALinear(attention.value)
    return model


def recorded(trainer: Any) -> Any:
    """Record each rank's micro-batches (for the kaisa_ds.initialize reference on the same data)."""
    trainer.batches = []
    step = trainer.training_step

    def training_step(model: Any, inputs: dict, num_items_in_batch: Any = None) -> torch.Tensor:
        trainer.batches.append({k: v.clone() for k, v in inputs.items()})
        return step(model, inputs, num_items_in_batch)

    trainer.training_step = training_step
    return trainer


def epoch_losses(result: dict, windows_per_epoch: int) -> list[float]:
    losses = result["losses"]
    return [sum(losses[i:i + windows_per_epoch]) / windows_per_epoch
            for i in range(0, len(losses), windows_per_epoch)]


def modes(work: str) -> dict:
    """The Trainer as users run it, against kaisa_ds.initialize on the same micro-batches where a reference exists
    (ZeRO-1/2, bf16, gradient checkpointing), else that it learns (short windows, label smoothing, LoRA)."""
    from tests.kaisa_ds.hf.hf_worker import reference

    res: dict = {}
    for name, cfg, extra in [("zero1", ds_config(stage=1), {}), ("zero2", ds_config(stage=2), {}),
                             ("bf16", ds_config(bf16=True), {"bf16": True}),
                             ("checkpointing", ds_config(), {"gradient_checkpointing": True})]:
        trainer = recorded(build(args_for(f"{work}-{name}", cfg, **extra)))
        try:
            res[name] = run(trainer)
            res[name]["reference"] = reference(trainer.batches, 3)
        except Exception as exc:
            res[name] = {"error": f"{type(exc).__name__}: {exc}"}
    # 40 examples on 2 ranks x 4: 5 micro-batches per epoch, windows of 2, 2 and a short 1 at each epoch's end;
    # factor_decay 0: each step's G factors are that window's statistics alone
    from transformers import TrainerCallback

    class GScale(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            kfac = self.trainer.model_wrapped.kfac
            self.norms.append(sum(float(ly.g_factor.float().norm()) for ly in kfac.layers.values()
                                  if ly.g_factor is not None))

    g_scale = GScale()
    g_scale.norms = []
    trainer = build(args_for(f"{work}-short", ds_config(kfac={**KFAC, "factor_decay": 0.0}), num_train_epochs=3,
                             max_steps=-1), examples=40, callbacks=[g_scale])
    g_scale.trainer = trainer
    res["short_window"] = run(trainer)
    res["short_window"]["g_norms"] = g_scale.norms
    scenarios: list[tuple[str, dict, dict]] = [
        ("label_smoothing", {"examples": 32}, {"num_train_epochs": 3, "max_steps": -1, "label_smoothing_factor": 0.1}),
        ("lora", {"examples": 32, "model": None}, {"num_train_epochs": 6, "max_steps": -1, "learning_rate": 5e-2}),
    ]
    for name, build_kwargs, extra in scenarios:
        if name == "lora":
            build_kwargs = {**build_kwargs, "model": lora_model()}
        trainer = build(args_for(f"{work}-{name}", ds_config(), **extra), **build_kwargs)
        try:
            res[name] = run(trainer)
            res[name]["kfac_layers"] = sorted(trainer.model_wrapped.kfac.layers)
        except Exception as exc:
            res[name] = {"error": f"{type(exc).__name__}: {exc}"}

    # auto_find_batch_size: an out-of-memory error in the first step makes the Trainer build a second engine
    trainer = build(args_for(f"{work}-auto", ds_config(), steps=2, auto_find_batch_size=True))
    step, failed = trainer.training_step, {"done": False}

    def training_step(*args: Any, **kwargs: Any) -> torch.Tensor:
        if not failed["done"]:
            failed["done"] = True
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")  # what a CPU OOM says
        return step(*args, **kwargs)

    trainer.training_step = training_step
    res["auto_batch"] = run(trainer)
    res["auto_batch"]["hooks"] = len(trainer.model.bert.encoder.layer[0].output.dense._forward_hooks)
    res["auto_batch"]["batch"] = trainer._train_batch_size

    # load_best_model_at_end: the Trainer reloads the best checkpoint through the engine's load_checkpoint
    trainer = build(args_for(f"{work}-best", ds_config(), steps=3, save_strategy="steps", save_steps=1,
                             eval_strategy="steps", eval_steps=1, load_best_model_at_end=True,
                             metric_for_best_model="loss", greater_is_better=True),  # an earlier one is best
                    eval_dataset=masked_lm_examples(16, seed=5))
    res["best"] = run(trainer)
    res["best"]["best_checkpoint"] = trainer.state.best_model_checkpoint
    res["best"]["kfac_steps_after_load"] = trainer.model_wrapped.kfac.steps
    for stage in (1, 2):
        res[f"skipped_layer_overflow_z{stage}"] = skipped_layer_overflow(work, stage=stage)
    res["peft"] = peft_lora(work)
    res["accelerate_csv"] = accelerate_reports(work)
    return res


def peft_lora(work: str) -> dict | None:
    """A real PEFT LoRA model (when peft is installed): the Trainer saves only the trainable parameters
    (exclude_frozen_parameters) and the run learns; None without peft."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        return None
    model = get_peft_model(tiny_bert_mlm(), LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]))
    trainer = build(args_for(f"{work}-peft", ds_config(), num_train_epochs=6, max_steps=-1, learning_rate=5e-2,
                             save_strategy="steps", save_steps=6), model=model, examples=32)
    result = run(trainer)
    result["kfac_layers"] = sorted(trainer.model_wrapped.kfac.layers)
    states = next(iter(sorted(Path(f"{work}-peft").rglob("mp_rank_00_model_states.pt"))))
    result["saved_module_keys"] = sorted(torch.load(states, map_location="cpu", weights_only=False)["module"])
    return result


def accelerate_reports(work: str) -> dict:
    """A hand-written accelerate loop (after the Trainers: a fresh AcceleratorState, as hyperparameter_search
    makes) with report_every=1 and a CSV monitor; returns the monitor's folder and the steps taken."""
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DeepSpeedPlugin

    from tests.kaisa_ds.hf.hf_worker import adamw, rank_batches

    AcceleratorState()._reset_state()
    GradientState._reset_state()  # the Trainers' accumulation settings live in this singleton too
    PartialState(cpu=True)  # CPU ranks: else accelerate counts a world of 1 (attach_to_accelerator refuses that)
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": 0}, "kfac": KFAC,
           "csv_monitor": {"enabled": True, "output_path": work + "-accelerate-csv", "job_name": "kfac"}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=cfg), gradient_accumulation_steps=GAS)
    model = tiny_bert_mlm()
    model, optimizer = accelerator.prepare(model, adamw(model))
    kaisa_ds.attach_to_accelerator(accelerator, report_every=1)
    for batch in rank_batches(2):
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
    return {"csv": work + "-accelerate-csv", "steps": accelerator.deepspeed_engine_wrapped.engine.global_steps}


def save(work: str) -> dict:
    """2 ranks, ZeRO-0 and ZeRO-1: 4 steps with a checkpoint at step 2 (for ``resume`` on another world size)."""
    res: dict = {}
    for stage in (0, 1):
        trainer = build(args_for(f"{work}-z{stage}", ds_config(stage=stage), steps=4, save_strategy="steps",
                                 save_steps=2))
        res[f"z{stage}"] = run(trainer)
    return res


def resume(work: str) -> dict:
    """1 rank resuming the 2-rank checkpoints of ``save`` (``work`` is that run's ``OUT.work``)."""
    res: dict = {}
    for stage in (0, 1):
        trainer = build(args_for(f"{work}-resumed-z{stage}", ds_config(stage=stage), steps=4))
        try:
            res[f"z{stage}"] = run(trainer, resume_from_checkpoint=f"{work}-z{stage}/checkpoint-2")
        except Exception as exc:
            res[f"z{stage}"] = {"error": f"{type(exc).__name__}: {exc}"}
    return res


GROUPS: dict[str, Callable[[str], dict]] = {"core": core, "modes": modes, "save": save, "resume": resume}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("group", choices=sorted(GROUPS))
    parser.add_argument("out")
    parser.add_argument("--local_rank", type=int, default=0)
    parser.add_argument("--work", default=None, help="the OUT.work of an earlier launch (resume reads its checkpoints)")
    args = parser.parse_args()
    from deepspeed.accelerator import get_accelerator

    get_accelerator().is_fp16_supported = lambda: True  # CPU: lift DeepSpeed's fp16 refusal
    from kaisa_ds.engine.launch import init_distributed

    logging.getLogger("kaisa_ds").addHandler(_Collect())
    logging.getLogger("kaisa_ds").setLevel(logging.INFO)
    rank, _ = init_distributed()
    results = GROUPS[args.group](args.work or f"{args.out}.work")
    torch.save(results, f"{args.out}.rank{rank}.pt")


if __name__ == "__main__":
    main()
