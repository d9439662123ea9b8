"""Fused LAMB + K-FAC on the GPU: DeepSpeed's FusedLamb (JIT-built op) and NVIDIA Apex FusedLAMB (when importable)
train as a pure-PyTorch LAMB of their own semantics does, within a tolerance, through kaisa_ds.initialize: Apex's
against kaisa_ds's LAMB, DeepSpeed's against a transcription of its kernel (the two LAMBs differ)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from kaisa_ds.optim import select
from kaisa_ds.optim.lamb import Lamb
from tests.gpu.conftest import needs_cuda
from tests.gpu.runs import build, ds_config, train
from tests.support.models import TinyTransformerish

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("single_rank")]
LR, STEPS = 0.01, 4
COMMON: dict[str, Any] = {"lr": LR, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01, "max_grad_norm": 1.0,
                          "bias_correction": True}
NO_CLAMP = {"max_coeff": 1e9, "min_coeff": 0.0}  # DeepSpeed's trust-ratio clamp off: Apex has none
# relative loss tolerance of a fused LAMB against the pure-PyTorch LAMB of its own semantics
TOLERANCE = {"fp32": 1e-3, "bf16": 3e-2}


class DeepSpeedLambReference(torch.optim.Optimizer):
    """DeepSpeed FusedLamb's CUDA kernel (deepspeed/ops/csrc/lamb/fused_lamb_cuda_kernel.cu, eps outside the sqrt)
    in plain PyTorch, with the global-norm clipping kaisa_ds's wrapper feeds it. It is not Apex's LAMB: the step
    ``lr·sqrt(1-β₂ᵗ)/(1-β₁ᵗ)`` multiplies the trust-ratio-normalised raw Adam update."""

    def __init__(self, params: Any, *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 max_grad_norm: float, bias_correction: bool, max_coeff: float, min_coeff: float) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      max_grad_norm=max_grad_norm, bias_correction=bias_correction,
                                      max_coeff=max_coeff, min_coeff=min_coeff))

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x.float()) for x in grads])))
        for group in self.param_groups:
            clip = (norm + 1e-6) / group["max_grad_norm"] if group["max_grad_norm"] > 0 else 0.0
            scale = clip if clip > 1 else 1.0
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["step"] += 1
                t, g = state["step"], p.grad.float() / scale
                state["m"].mul_(b1).add_(g, alpha=1 - b1)
                state["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                size = group["lr"] * (math.sqrt(1 - b2**t) / (1 - b1**t) if group["bias_correction"] else 1.0)
                update = state["m"] / (state["v"].sqrt() + group["eps"]) + group["weight_decay"] * p
                w, u = float(p.norm()), float(update.norm())
                coeff = min(max(w / u, group["min_coeff"]), group["max_coeff"]) if w and u else 1.0
                p.sub_(update, alpha=size * coeff)


REFERENCES = {"apex": lambda groups: Lamb(groups, **COMMON),
              "deepspeed": lambda groups: DeepSpeedLambReference(groups, **COMMON, **NO_CLAMP)}


def _lamb_run(mode: str, stage: int, device: torch.device, make: Any) -> tuple[list[float], Any]:
    torch.manual_seed(0)
    model = TinyTransformerish().to(device)
    # one decayed group: Apex (and kaisa_ds) apply the trust ratio to decayed groups only, DeepSpeed to all
    opt = make([{"params": list(model.parameters()), "weight_decay": COMMON["weight_decay"]}])
    cfg = ds_config(mode, stage)
    del cfg["optimizer"]  # the client optimizer is the one under test
    engine = build(cfg, device, optimizer=opt, model=model)
    return train(engine, device, range(STEPS)), engine


@pytest.fixture(scope="module")
def pure_torch(device: torch.device, single_rank: None) -> dict[tuple[str, str], list[float]]:
    """Losses of the pure-PyTorch reference of each implementation's semantics, per (implementation, mode)."""
    return {(impl, mode): _lamb_run(mode, stage, device, make)[0]
            for impl, make in REFERENCES.items() for mode, stage in (("fp32", 0), ("bf16", 0))}


def test_pure_torch_lamb_with_kfac_runs(pure_torch: dict[tuple[str, str], list[float]]) -> None:
    """The references of the fused runs (also what the CPU smoke runs of this file): finite, and the two
    semantics do train differently (DeepSpeed's early steps are shorter)."""
    for key, losses in pure_torch.items():
        assert len(losses) == STEPS and all(torch.isfinite(torch.tensor(losses))), key
    assert pure_torch[("apex", "fp32")][-1] != pytest.approx(pure_torch[("deepspeed", "fp32")][-1], rel=1e-3)


@pytest.mark.parametrize("impl", ["deepspeed", "apex"])
@pytest.mark.parametrize(("mode", "stage"), [("fp32", 0), ("bf16", 0)])  # Lamb: ZeRO-0 only (ds_config)
def test_fused_lamb_with_kfac_matches_its_pure_torch_reference(
        device: torch.device, pure_torch: dict[tuple[str, str], list[float]], impl: str, mode: str,
        stage: int) -> None:
    needs_cuda()
    if impl == "apex":
        cls, why = select._apex_fused_lamb([torch.zeros(1, device=device)])
        if cls is None:
            pytest.skip(why)
        make = lambda groups: cls(groups, **COMMON)  # noqa: E731
    else:
        make = lambda groups: select.build_lamb(groups, **COMMON, **NO_CLAMP, implementation="deepspeed")[0]  # noqa: E731
    losses, engine = _lamb_run(mode, stage, device, make)
    assert engine.kfac.skipped_windows == 0
    assert losses == pytest.approx(pure_torch[(impl, mode)], rel=TOLERANCE[mode])


def test_config_lamb_implementation_reaches_the_engine(device: torch.device) -> None:
    """``"optimizer": {"type": "Lamb"}`` gets Apex's FusedLAMB or kaisa_ds's LAMB (one semantics); with
    ``"implementation": "deepspeed"`` DeepSpeed's FusedLamb, JIT-built on this GPU."""
    needs_cuda()
    auto = build(ds_config("bf16", 0, lamb_lr=LR), device)
    apex, _ = select._apex_fused_lamb([torch.zeros(1, device=device)])
    assert type(auto.client_optimizer).__name__ == ("FusedLAMB" if apex else "Lamb")
    cfg = ds_config("bf16", 0, lamb_lr=LR)
    cfg["optimizer"]["params"]["implementation"] = "deepspeed"
    engine = build(cfg, device)
    assert type(engine.client_optimizer).__name__ == "GlobalNormFusedLamb"
    losses = train(engine, device, range(2))
    assert engine.kfac.steps == 2 and all(x == x for x in losses)
