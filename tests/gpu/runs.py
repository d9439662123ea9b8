"""Train TinyTransformerish through kaisa_ds.initialize on one rank of the test device (CUDA, or the CPU smoke).

The configs and batches are the CPU engine tests' (tests/kaisa_ds/engine/ds_worker.py), with world size 1.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tests.kaisa_ds.engine.ds_worker import config, micro_batches
from tests.support.models import TinyTransformerish

KFAC: dict[str, Any] = {"enabled": True, "damping": 0.01, "kl_clip": 0.05, "factor_decay": 0.9,
                        "inv_update_steps": 2}


def ds_config(mode: str, stage: int, *, kfac: dict[str, Any] | None = None, lamb_lr: float | None = None) -> dict:
    """ds_worker's config for one rank; ``lamb_lr`` swaps SGD for ``"optimizer": {"type": "Lamb"}``."""
    cfg = config(mode, stage, 1, kfac={**KFAC, **(kfac or {})})
    if lamb_lr is not None:
        cfg["optimizer"] = {"type": "Lamb", "params": {"lr": lamb_lr, "weight_decay": 0.01}}
    return cfg


def build(cfg: dict, device: torch.device, *, optimizer: Any = None, model: torch.nn.Module | None = None) -> Any:
    import kaisa_ds

    if model is None:
        torch.manual_seed(0)
        model = TinyTransformerish().to(device)
    engine, *_ = kaisa_ds.initialize(model=model, model_parameters=None if optimizer else model.parameters(),
                                     optimizer=optimizer, config=cfg)
    return engine


def train(engine: Any, device: torch.device, steps: range, *, inject_inf_at: int | None = None) -> list[float]:
    """Optimizer steps ``steps`` (batch numbers); the mean micro-batch loss of each."""
    losses = []
    for step in steps:
        total = 0.0
        batches = micro_batches(step, 0, 1)
        for ids, target in batches:
            loss = F.mse_loss(engine(ids.to(device)).float(), target.to(device))
            if inject_inf_at == step:
                loss = loss * float("inf")
            engine.backward(loss)
            engine.step()
            total += float(loss.detach()) / len(batches)
        losses.append(total)
    return losses


def factors(engine: Any) -> dict[str, torch.Tensor]:
    """Every committed factor at its true scale (FP32)."""
    return {name: f.value.float().clone() for name, f in engine.kfac.factors().items() if f.value is not None}
