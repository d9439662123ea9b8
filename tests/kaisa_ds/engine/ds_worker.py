"""Run by the deepspeed launcher from the engine tests: trains a tiny model through kaisa_ds.initialize.

Usage: deepspeed --num_gpus N ds_worker.py SCENARIO OUT.pt [options]
Every rank writes OUT.rank<r>.pt with what the test compares.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import kaisa_ds
from tests.support.models import TinyTransformerish

MICRO, GLOBAL = 4, 16


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, 11, (GLOBAL, 5), generator=g), torch.randn(GLOBAL, 5, 5, generator=g)


def micro_batches(step: int, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ids, target = global_batch(step)
    per_rank = GLOBAL // world
    ids, target = ids[rank * per_rank:(rank + 1) * per_rank], target[rank * per_rank:(rank + 1) * per_rank]
    return list(zip(ids.split(MICRO), target.split(MICRO)))


def config(mode: str, stage: int, world: int, *, kfac: dict | None, clip: float = 0.0,
           extra: dict | None = None) -> dict:
    cfg: dict = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GLOBAL // (MICRO * world),
                 "steps_per_print": 2, "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
                 "gradient_clipping": clip, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    if mode == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 1000}
    elif mode.startswith("bf16"):
        cfg["bf16"] = {"enabled": True}
        if mode == "bf16acc32":
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if kfac is not None:
        cfg["kfac"] = kfac
    cfg.update(extra or {})
    return cfg


def train(cfg: dict, steps: int, *, inject_inf_at: int | None = None, manual: bool = False,
          capture: bool = False) -> dict:
    """Train `steps` optimizer steps; return losses, factors and (optionally) pre/post-step tensors."""
    from deepspeed import comm as dist

    torch.manual_seed(0)
    model = TinyTransformerish()
    engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"losses": [], "captured": []}
    preconditioned: list[dict] = []
    if capture and engine.kfac is not None:
        kfac_step = engine.kfac.step

        def recording_step() -> None:
            kfac_step()
            preconditioned.append({n: p.grad.float().clone() for n, p in engine.module.named_parameters()})

        engine.kfac.step = recording_step
    for step in range(steps):
        total = 0.0
        for ids, target in micro_batches(step, rank, world):
            loss = F.mse_loss(engine(ids).float(), target)
            if inject_inf_at == step and rank == 1:
                loss = loss * float("inf")
            engine.backward(loss)
            total += float(loss) / len(micro_batches(step, rank, world))
            if engine.is_gradient_accumulation_boundary() and manual:
                engine.kfac.step()
            if engine.is_gradient_accumulation_boundary() and capture:
                before = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
            engine.step()
        if capture:
            after = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
            out["captured"].append({"before": before, "grads": preconditioned[-1], "after": after})
        t = torch.tensor([total])
        dist.all_reduce(t)
        out["losses"].append(float(t) / world)
    kfac = engine.kfac
    if kfac is not None:
        out["factors"] = {n: (ly.a_factor.float().clone(), ly.g_factor.float().clone()) for n, ly in kfac.layers.items()
                          if ly.a_factor is not None}
        out["skipped_windows"] = kfac.skipped_windows
        out["steps"] = kfac.steps
    out["skipped_steps"] = engine.skipped_steps
    out["optimizer"] = type(engine.optimizer).__name__
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("out")
    parser.add_argument("--local_rank", type=int, default=0)
    parser.add_argument("--ckpt", default="")
    args = parser.parse_args()
    from deepspeed.accelerator import get_accelerator

    get_accelerator().is_fp16_supported = lambda: True  # CPU: lift DeepSpeed's fp16 refusal for tests
    from kaisa_ds.engine.launch import init_distributed

    rank, world = init_distributed()
    kfac = {"enabled": True, "damping": 0.01, "kl_clip": 0.05, "factor_decay": 0.9, "inv_update_steps": 2,
            "grafting": "none"}  # as test_deepspeed_engine.KFAC
    results: dict = {}
    if args.scenario == "modes":
        for mode, stage in [("fp32", 0), ("fp32", 1), ("fp32", 2), ("bf16", 0), ("bf16", 2), ("bf16acc32", 1),
                            ("fp16", 0), ("fp16", 1), ("fp16", 2)]:
            results[f"{mode}-z{stage}"] = train(config(mode, stage, world, kfac=kfac), 2)
        results["manual"] = train(config("fp32", 0, world, kfac={**kfac, "auto_step": False}), 2, manual=True)
    elif args.scenario == "overflow":
        for mode, stage in [("fp16", 0), ("fp16", 1)]:
            results[f"{mode}-z{stage}"] = train(config(mode, stage, world, kfac=kfac), 3, inject_inf_at=1)
    elif args.scenario == "clip":
        results["clip"] = train(config("fp32", 0, world, kfac=kfac, clip=0.01), 2, capture=True)
    elif args.scenario == "monitor":
        extra = {"csv_monitor": {"enabled": True, "output_path": args.ckpt, "job_name": "kfac"}}
        results["monitor"] = train(config("fp32", 0, world, kfac=kfac, extra=extra), 4)
    elif args.scenario in ("save", "resume"):
        results = checkpoint_scenario(args.scenario, args.ckpt, world, kfac)
    elif args.scenario == "wrong":
        results = wrong_model_scenario(args.ckpt, world, kfac)
    torch.save(results, f"{args.out}.rank{rank}.pt")


def checkpoint_scenario(kind: str, ckpt: str, world: int, kfac: dict) -> dict:
    """save: train 2 steps, checkpoint, train 2 more. resume: load the checkpoint, train the last 2 steps."""
    from deepspeed import comm as dist

    cfg = config("fp32", 0, world, kfac=kfac)
    cfg["optimizer"] = {"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.01}}
    torch.manual_seed(0)
    model = TinyTransformerish()
    engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    rank = dist.get_rank()
    first = 0
    if kind == "resume":
        engine.load_checkpoint(ckpt, tag="mid")
        first = 2
    losses = []
    for step in range(first, 4):
        total = 0.0
        for ids, target in micro_batches(step, rank, world):
            loss = F.mse_loss(engine(ids), target)
            engine.backward(loss)
            engine.step()
            total += float(loss)
        t = torch.tensor([total / len(micro_batches(step, rank, world))])
        dist.all_reduce(t)
        losses.append(float(t) / world)
        if kind == "save" and step == 1:
            engine.save_checkpoint(ckpt, tag="mid")
    return {"losses": losses, "kfac_steps": engine.kfac.steps}


def wrong_model_scenario(ckpt: str, world: int, kfac: dict) -> dict:
    """Load the "save" scenario's checkpoint into models it does not fit (and into the same model, which a corrupted
    checkpoint must refuse too); return the error messages."""
    errors: dict[str, str | None] = {}
    for name, model, section in (("other_shapes", TinyTransformerish(dim=8), kfac),
                                 ("other_kfac_layers", TinyTransformerish(), {**kfac, "skip_layers": ["query"]}),
                                 ("same_model", TinyTransformerish(), kfac)):
        cfg = config("fp32", 0, world, kfac=section)
        cfg["optimizer"] = {"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.01}}
        engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        try:
            engine.load_checkpoint(ckpt, tag="mid")
            errors[name] = None
        except ValueError as exc:
            errors[name] = str(exc)
    return errors


if __name__ == "__main__":
    main()
