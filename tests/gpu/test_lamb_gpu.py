"""Fused LAMB + K-FAC on the GPU: DeepSpeed's FusedLamb (JIT-built op) and NVIDIA Apex FusedLAMB (when importable)
train as the pure-PyTorch LAMB of kaisa_ds does, within a tolerance, through kaisa_ds.initialize."""

from __future__ import annotations

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
# relative loss tolerance. DeepSpeed's FusedLamb adds eps before the bias correction (Apex after), hence its wider one
TOLERANCE = {("apex", "fp32"): 1e-4, ("deepspeed", "fp32"): 5e-3, ("apex", "bf16"): 3e-2, ("deepspeed", "bf16"): 3e-2}


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
def pure_torch(device: torch.device, single_rank: None) -> dict[str, list[float]]:
    return {mode: _lamb_run(mode, stage, device, lambda groups: Lamb(groups, **COMMON))[0]
            for mode, stage in (("fp32", 0), ("bf16", 0))}


def test_pure_torch_lamb_with_kfac_runs(pure_torch: dict[str, list[float]]) -> None:
    """The reference of the fused runs (also what the CPU smoke runs of this file)."""
    for mode, losses in pure_torch.items():
        assert len(losses) == STEPS and all(torch.isfinite(torch.tensor(losses))), mode


@pytest.mark.parametrize("impl", ["deepspeed", "apex"])
@pytest.mark.parametrize(("mode", "stage"), [("fp32", 0), ("bf16", 0)])  # Lamb: ZeRO-0 only (ds_config)
def test_fused_lamb_with_kfac_matches_pure_torch_lamb(device: torch.device, pure_torch: dict[str, list[float]],
                                                      impl: str, mode: str, stage: int) -> None:
    needs_cuda()
    if impl == "apex":
        probe = [torch.zeros(1, device=device)]
        cls, why = select._apex_fused_lamb(probe)
        kwargs = COMMON
    else:
        cls, why = select._deepspeed_fused_lamb()
        kwargs = {**COMMON, "max_coeff": 1e9, "min_coeff": 0.0}  # no trust-ratio clamp: Apex has none
    if cls is None:
        pytest.skip(why)
    losses, engine = _lamb_run(mode, stage, device, lambda groups: cls(groups, **kwargs))
    assert engine.kfac.skipped_windows == 0
    assert losses == pytest.approx(pure_torch[mode], rel=TOLERANCE[(impl, mode)])


def test_config_lamb_picks_a_fused_lamb_on_cuda(device: torch.device) -> None:
    """``"optimizer": {"type": "Lamb"}`` gets Apex's or DeepSpeed's fused LAMB on a GPU, not the PyTorch fallback."""
    needs_cuda()
    engine = build(ds_config("bf16", 0, lamb_lr=LR), device)
    assert type(engine.client_optimizer).__name__ in ("FusedLAMB", "GlobalNormFusedLamb")
    losses = train(engine, device, range(2))
    assert engine.kfac.steps == 2 and all(x == x for x in losses)
