"""Held-out evaluation: MLM loss and accuracy, NSP accuracy, spread over the ranks and summed."""

from __future__ import annotations

import logging
from typing import Any

import torch

from bert_pretrain.data.examples import IGNORE
from bert_pretrain.data.loader import to_device
from bert_pretrain.model import STATS, MaskedLMLoss, PretrainingLoss

logger = logging.getLogger(__name__)


def most_frequent_target(train_set: Any, *, sample: int = 20_000) -> int:
    """The token most often masked in (the first ``sample``) training examples: the 'frequent-token' baseline
    always predicts it."""
    ids = train_set.select_columns(["masked_lm_ids"])[:sample]["masked_lm_ids"].flatten()
    return int(torch.bincount(ids[ids != IGNORE]).argmax())


def evaluate(module: PretrainingLoss | MaskedLMLoss, heldout: Any, *, device: torch.device, examples: int,
             micro_batch: int, rank: int = 0, world: int = 1, baseline_token: int | None = None) -> dict[str, float]:
    """Metrics over the first ``examples`` held-out examples (each rank takes every ``world``-th one; summed over
    the ranks with DeepSpeed's comm when ``world`` > 1). NSP metrics only from a model with NSP; the frequent-token
    baseline's accuracy only with its ``baseline_token``."""
    mine = list(range(rank, min(examples, len(heldout)), world))
    totals = torch.zeros(len(STATS) + 1, dtype=torch.float64, device=device)
    was_training = module.training
    module.eval()
    with torch.no_grad():
        for start in range(0, len(mine), micro_batch):
            batch = to_device(heldout[mine[start:start + micro_batch]], device)
            module(batch)
            assert module.last is not None
            stats = module.last.double()
            stats[1] *= stats[4]  # mean MLM loss of the batch → sum over its predictions
            stats[0] = stats[2] * stats[6]  # NSP loss summed over sequences (the total loss is not reported)
            targets = batch["masked_lm_ids"]
            hits = (targets == baseline_token).sum().double() if baseline_token is not None else stats.new_zeros(())
            totals += torch.cat([stats, hits.reshape(1)])
    module.train(was_training)
    if world > 1:
        from deepspeed import comm as dist

        dist.all_reduce(totals)
    mlm_count, nsp_count = float(totals[4]), float(totals[6])
    if mlm_count == 0:
        logger.warning("no held-out examples to evaluate (--eval-examples %d, %d held out)", examples, len(heldout))
        return {}
    metrics = {"heldout_mlm_loss": float(totals[1]) / mlm_count, "heldout_mlm_accuracy": float(totals[3]) / mlm_count}
    if baseline_token is not None:
        metrics["heldout_mlm_baseline_accuracy"] = float(totals[7]) / mlm_count
    if nsp_count:
        metrics.update(heldout_nsp_loss=float(totals[0]) / nsp_count, heldout_nsp_accuracy=float(totals[5]) / nsp_count)
    return metrics
