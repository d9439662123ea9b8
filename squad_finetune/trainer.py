"""The fine-tuning loop on a DeepSpeed engine (from ``kaisa_ds.initialize``): data order, AdamW, schedule, logging.

The engine owns gradient averaging, accumulation, precision, clipping, the LR schedule step and (when the config
has a ``kfac`` section) K-FAC preconditioning; this module only feeds it batches and records what happened.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import datasets
import torch
from deepspeed import comm as dist
from torch.utils.data import DataLoader, DistributedSampler
from tqdm.auto import tqdm

from kaisa_ds.optim.param_groups import weight_decay_groups
from kaisa_ds.report.metrics_log import MetricsLog
from squad_finetune.settings import Recipe

logger = logging.getLogger(__name__)

TRAIN_COLUMNS = ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions")


def build_optimizer(model: torch.nn.Module, recipe: Recipe) -> torch.optim.AdamW:
    """AdamW over BERT's weight-decay groups (biases and LayerNorm undecayed)."""
    groups = weight_decay_groups(model, weight_decay=recipe.weight_decay)
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps)


def linear_warmup_schedule(total_steps: int, warmup_proportion: float) -> Callable[[torch.optim.Optimizer], Any]:
    """DeepSpeed ``lr_scheduler`` callable: linear warmup over the first share of steps, then linear decay to 0."""
    from transformers import get_linear_schedule_with_warmup

    warmup = int(round(warmup_proportion * total_steps))
    return lambda optimizer: get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


@dataclass(frozen=True)
class TrainPlan:
    """How the training features are cut into batches and optimizer steps on this rank."""

    micro_batch: int
    accumulation: int
    world_size: int
    micro_steps_per_epoch: int
    total_steps: int

    @classmethod
    def make(cls, num_features: int, *, micro_batch: int, accumulation: int, world_size: int,
             recipe: Recipe) -> TrainPlan:
        micro_per_epoch = math.ceil(num_features / (micro_batch * world_size))
        total = max(1, recipe.epochs * micro_per_epoch // accumulation)  # DeepSpeed steps on full windows only
        if recipe.max_steps is not None:
            if recipe.max_steps > total:  # the epochs end the run first: say so rather than stop short silently
                logger.warning("--max-steps %d: the run stops after %d steps, all that %d epoch(s) of %d windows "
                               "give; raise --epochs (squad_finetune.epochs) for more", recipe.max_steps, total,
                               recipe.epochs, num_features)
            total = min(total, recipe.max_steps)
        return cls(micro_batch, accumulation, world_size, micro_per_epoch, total)


def train_loader(
    features: datasets.Dataset, *, collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]],
    micro_batch: int, rank: int, world_size: int, seed: int,
) -> tuple[DataLoader, DistributedSampler]:
    """A shuffled loader over this rank's share of the windows (reshuffled every epoch with ``set_epoch``)."""
    data = features.select_columns(list(TRAIN_COLUMNS))
    sampler: DistributedSampler = DistributedSampler(
        data, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)  # type: ignore[arg-type]
    return DataLoader(data, batch_size=micro_batch, sampler=sampler, collate_fn=collate), sampler  # type: ignore[arg-type]


@dataclass
class TrainResult:
    steps: int
    seconds: float
    final_loss: float
    skipped_steps: int


class _StepLogger:
    """Averages the loss over ranks and micro-steps between log lines (one host sync per line, none per step)."""

    def __init__(self, engine: Any, metrics: MetricsLog, *, sequences_per_micro_step: int) -> None:
        self.engine = engine
        self.metrics = metrics
        self.seq_per_micro = sequences_per_micro_step
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=engine.device)
        self.micro = 0
        self.window_start = time.perf_counter()
        self.last_loss = float("nan")

    def add(self, loss: torch.Tensor) -> None:
        self.loss_sum += loss.detach().float()
        self.micro += 1

    def flush(self, *, step: int, epoch: int) -> float:
        if self.micro == 0:
            return self.last_loss
        total = torch.stack([self.loss_sum, torch.tensor(float(self.micro), device=self.loss_sum.device)])
        dist.all_reduce(total)
        loss = (total[0] / total[1]).item()
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        kfac = getattr(self.engine, "kfac", None)
        extra = {} if kfac is None else {"kfac_steps": int(kfac.steps), "kfac_seconds": dict(kfac.timings or {})}
        self.metrics.write(dict(
            event="train", step=step, epoch=epoch, loss=loss, lr=float(self.engine.get_lr()[0]),
            sequences_per_s=self.micro * self.seq_per_micro / elapsed,
            loss_scale=float(getattr(self.engine.optimizer, "loss_scale", 1.0)),
            skipped_steps=int(self.engine.skipped_steps), **extra,
        ))
        self.loss_sum.zero_()
        self.micro = 0
        self.window_start = time.perf_counter()
        self.last_loss = loss
        return loss


def _batches(loader: DataLoader, sampler: DistributedSampler, epochs: int) -> Iterable[tuple[int, dict[str, Any]]]:
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            yield epoch, batch


def train(
    engine: Any, loader: DataLoader, sampler: DistributedSampler, *, plan: TrainPlan, recipe: Recipe,
    metrics: MetricsLog, log_every: int, show_progress: bool,
) -> TrainResult:
    """Run ``plan.total_steps`` optimizer steps (over ``recipe.epochs`` epochs at most)."""
    engine.train()
    step_log = _StepLogger(engine, metrics, sequences_per_micro_step=plan.micro_batch * plan.world_size)
    bar = tqdm(total=plan.total_steps, desc="Fine-tuning", unit="step", disable=not show_progress)
    start = time.perf_counter()
    loss = float("nan")
    epoch = 0
    for epoch, batch in _batches(loader, sampler, recipe.epochs):
        batch = {k: v.to(engine.device) for k, v in batch.items()}
        out = engine(**batch)
        engine.backward(out.loss)
        before = engine.global_steps
        engine.step()
        step_log.add(out.loss)
        if engine.global_steps == before:
            continue  # inside a gradient-accumulation window
        bar.update(1)
        step = engine.global_steps
        if step % log_every == 0 or step == plan.total_steps:
            loss = step_log.flush(step=step, epoch=epoch)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{engine.get_lr()[0]:.2e}")
            _check_finite(loss, step=step, engine=engine)
        if step >= plan.total_steps:
            break
    bar.close()
    seconds = time.perf_counter() - start
    return TrainResult(steps=int(engine.global_steps), seconds=seconds, final_loss=loss,
                       skipped_steps=int(engine.skipped_steps))


def _check_finite(loss: float, *, step: int, engine: Any) -> None:
    if math.isfinite(loss):
        return
    if hasattr(engine.optimizer, "loss_scale"):  # fp16: DeepSpeed skips overflowing steps and lowers the scale
        logger.warning("non-finite training loss at step %d (fp16 overflow; the step is skipped)", step)
        return
    raise FloatingPointError(f"the training loss became {loss} at step {step}; lower the learning rate "
                             "(optimizer.params.lr / --lr) or enable gradient_clipping in the config")
