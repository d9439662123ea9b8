"""Runs kaisa_ds Lamb + PolyWarmUpScheduler inside deepspeed.initialize on one process; prints a JSON summary.

Used by test_lamb_deepspeed.py in a subprocess (DeepSpeed's process group must not leak into pytest).
Expects RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment; argv[1] is a scratch dir.
"""

from __future__ import annotations

import copy
import json
import sys

import deepspeed
import torch
import torch.nn.functional as F

from kaisa_ds.engine.launch import skip_cpu_shm_build
from kaisa_ds.optim.lamb import Lamb
from kaisa_ds.optim.param_groups import weight_decay_groups
from kaisa_ds.optim.poly_warmup import PolyWarmUpScheduler

LR, WARMUP, TOTAL = 0.05, 0.5, 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(4, 6, generator=gen), torch.randn(4, 3, generator=gen)


def _engine(model: torch.nn.Module, extra: dict) -> tuple[object, Lamb, PolyWarmUpScheduler]:
    opt = Lamb(weight_decay_groups(model, weight_decay=0.01), lr=LR)
    sched = PolyWarmUpScheduler(opt, warmup_proportion=WARMUP, total_steps=TOTAL)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 10**6,
              "zero_optimization": {"stage": 0}, **extra}
    skip_cpu_shm_build()
    engine, _, _, engine_sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=config)
    assert engine_sched is sched, "deepspeed.initialize did not keep the PolyWarmUpScheduler instance"
    return engine, opt, sched


def _train_step(engine: object, step: int, dtype: torch.dtype = torch.float32) -> float:
    x, y = _batch(step)
    loss = F.mse_loss(engine(x.to(dtype)).float(), y)  # type: ignore[operator]
    engine.backward(loss)  # type: ignore[attr-defined]
    engine.step()  # type: ignore[attr-defined]
    return float(loss.detach())


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for p in module.parameters()])


def fp32_run(scratch: str) -> dict:
    """Two engine steps vs two plain Lamb steps; then a checkpoint resume of the second step."""
    model = _model()
    ref = copy.deepcopy(model)
    engine, opt, _ = _engine(model, {})
    ref_opt = Lamb(weight_decay_groups(ref, weight_decay=0.01), lr=LR)
    ref_sched = PolyWarmUpScheduler(ref_opt, warmup_proportion=WARMUP, total_steps=TOTAL)
    lrs = []
    for step in range(2):
        lrs.append(engine.get_lr()[0])  # type: ignore[attr-defined]
        if step == 1:
            engine.save_checkpoint(scratch, tag="after1")  # type: ignore[attr-defined]
        _train_step(engine, step)
        x, y = _batch(step)
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_sched.step()
    continuous = _flat(model)
    engine.load_checkpoint(scratch, tag="after1")  # type: ignore[attr-defined]
    resumed_lr = engine.get_lr()[0]  # type: ignore[attr-defined]
    _train_step(engine, 1)
    return {
        "engine_optimizer_is_lamb": engine.optimizer is opt,  # type: ignore[attr-defined]
        "max_diff_vs_plain": float((continuous - _flat(ref)).abs().max()),
        "moved": float((continuous - _flat(_model())).abs().max()),
        "max_diff_resumed": float((_flat(model) - continuous).abs().max()),
        "lrs": lrs, "resumed_lr": resumed_lr, "lamb_steps": [g["step"] for g in opt.param_groups],
    }


def bf16_run() -> dict:
    """bf16 ZeRO-0: DeepSpeed's unfused optimizer hands Lamb fp32 master copies."""
    engine, opt, _ = _engine(_model(), {"bf16": {"enabled": True}})
    losses = [_train_step(engine, step, torch.bfloat16) for step in range(2)]
    return {"wrapper": type(engine.optimizer).__name__,  # type: ignore[attr-defined]
            "lamb_param_dtypes": sorted({str(p.dtype) for g in opt.param_groups for p in g["params"]}),
            "losses": losses}


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("RESULT " + json.dumps({"fp32": fp32_run(sys.argv[1]), "bf16": bf16_run()}))
