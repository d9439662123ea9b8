"""kaisa_ds.initialize on the GPU: fp16 (dynamic loss scale, overflow windows dropped) and bf16 under ZeRO 0/1/2,
factor/decomposition dtypes, and K-FAC state save/resume. Eager mode only: no torch.compile, no CUDA graphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kaisa_ds.engine.grad_access import engine_loss_scale
from tests.gpu.runs import build, ds_config, factors, train

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("single_rank")]
TOLERANCE = {"bf16": 3e-2, "fp16": 5e-3}  # as the CPU engine tests: relative to the fp32 run
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@pytest.fixture(scope="module")
def fp32_reference(device: torch.device, single_rank: None) -> dict[str, Any]:
    engine = build(ds_config("fp32", 0), device)
    losses = train(engine, device, range(2))
    return {"losses": losses, "factors": factors(engine)}


@pytest.mark.parametrize("mode", ["fp16", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_half_precision_and_zero_match_the_fp32_run(device: torch.device, fp32_reference: dict[str, Any],
                                                    mode: str, stage: int) -> None:
    engine = build(ds_config(mode, stage), device)
    losses = train(engine, device, range(2))
    tol = TOLERANCE[mode]
    assert engine.kfac.skipped_windows == 0 and engine.kfac.steps == 2
    assert losses == pytest.approx(fp32_reference["losses"], rel=tol)
    got = factors(engine)
    assert set(got) == set(fp32_reference["factors"])
    for name, ref in fp32_reference["factors"].items():
        assert torch.isfinite(got[name]).all(), name
        assert (got[name] - ref).abs().max() <= tol * ref.abs().max(), f"{mode}-z{stage} {name}"


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_fp16_overflow_window_is_dropped_and_factors_stay_finite(device: torch.device, stage: int) -> None:
    cfg = ds_config("fp16", stage)
    cfg["fp16"]["hysteresis"] = 1  # back off on the first overflow (ZeRO's default waits for a second one)
    engine = build(cfg, device)
    scale = engine_loss_scale(engine)
    losses = train(engine, device, range(3), inject_inf_at=1)
    assert engine.kfac.skipped_windows == 1 and engine.skipped_steps == 1 and engine.kfac.steps == 3
    assert engine_loss_scale(engine) < scale  # the dynamic loss scale backed off
    for name, value in factors(engine).items():
        assert torch.isfinite(value).all(), name
    assert losses[2] < losses[0]  # training went on after the dropped window


@pytest.mark.parametrize(("mode", "factor_dtype", "inv_dtype"),
                         [("bf16", "fp16", "bf16"), ("fp16", "bf16", "fp32"), ("bf16", "bf16", "fp16"),
                          ("fp32", "fp16", None)])  # None: the default, "auto", is BF16 on CUDA even in an fp32 run
def test_factor_and_decomposition_dtypes(device: torch.device, mode: str, factor_dtype: str,
                                         inv_dtype: str | None) -> None:
    kfac = {"factor_dtype": factor_dtype} | ({"inv_dtype": inv_dtype} if inv_dtype else {})
    engine = build(ds_config(mode, 1, kfac=kfac), device)
    train(engine, device, range(2))
    stored = [f._stored for f in engine.kfac.factors().values() if f._stored is not None]
    assert stored and all(t.dtype == DTYPES[factor_dtype] and t.device.type == device.type for t in stored)
    decs = [t for d in engine.kfac.decompositions.values() for t in d.tensors()]
    want = DTYPES[inv_dtype] if inv_dtype else torch.bfloat16 if device.type == "cuda" else torch.float32  # CPU dry run
    assert decs and all(t.dtype == want and t.device.type == device.type for t in decs)
    assert all(torch.isfinite(t).all() for t in decs)


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_kfac_state_resumes_identically(device: torch.device, tmp_path: Path, mode: str) -> None:
    cfg = ds_config(mode, 0, lamb_lr=0.01)
    engine = build(cfg, device)
    train(engine, device, range(2))
    engine.save_checkpoint(str(tmp_path), tag="mid")
    saved = factors(engine)
    rest = train(engine, device, range(2, 4))
    resumed = build(cfg, device)
    resumed.load_checkpoint(str(tmp_path), tag="mid")
    assert resumed.kfac.steps == 2
    for name, value in factors(resumed).items():
        torch.testing.assert_close(value, saved[name])
    assert train(resumed, device, range(2, 4)) == pytest.approx(rest, rel=1e-5)
    assert resumed.kfac.steps == 4
