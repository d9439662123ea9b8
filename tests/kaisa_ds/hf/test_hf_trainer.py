"""kaisa_ds.enable_kfac inside the HF Trainer (transformers 5.24 + accelerate 1.15 + DeepSpeed 0.19.8) on 2 CPU ranks
under the deepspeed launcher: a tiny BertForMaskedLM whose per-step losses and K-FAC factors match the same run
through kaisa_ds.initialize, the order K-FAC / clip / optimizer, checkpoint resume, and fp16 overflow windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kaisa_ds.checkpoint.shards import META
from kaisa_ds.engine.checkpoint import SHARDS_KEY
from tests.kaisa_ds.hf import hf_worker
from tests.support.launch import run_deepspeed

WORKER = str(Path(hf_worker.__file__))
FACTOR_RTOL = 1e-3  # relative to each factor's largest entry; measured 3.5e-5 (fused AdamW rounding, 3 steps)
LOSS_RTOL = 1e-5  # measured 2e-7


def _launch(scenario: str, tmp_path: Path) -> dict:
    out = tmp_path / scenario
    run_deepspeed([WORKER, scenario, str(out)])
    return torch.load(f"{out}.rank0.pt", weights_only=False)


def test_trainer_matches_kaisa_ds_initialize_and_clips_the_preconditioned_gradient(tmp_path: Path) -> None:
    got = _launch("compare", tmp_path)
    trainer, reference = got["trainer"], got["reference"]
    assert trainer["ds_gas"] == hf_worker.GAS and trainer["kfac_steps"] == reference["kfac_steps"] == 3
    assert trainer["optimizer_is_trainers"] and trainer["optimizer"] == "AdamW"  # K-FAC feeds the Trainer's AdamW
    assert "'fused': True" in got["trainer_optimizer"]  # the reference's AdamW is the same kind
    assert trainer["losses"] == pytest.approx(reference["losses"], rel=LOSS_RTOL)
    assert set(trainer["factors"]) == set(reference["factors"]) and len(reference["factors"]) > 10
    for name, (a, g) in reference["factors"].items():
        ta, tg = trainer["factors"][name]
        assert (ta - a).abs().max() <= FACTOR_RTOL * a.abs().max(), f"{name} A"
        assert (tg - g).abs().max() <= FACTOR_RTOL * g.abs().max(), f"{name} G"
    events = trainer["events"]  # per window: K-FAC, then DeepSpeed clips to max_grad_norm=1, then the optimizer
    assert [e[0] for e in events] == ["kfac", "optimizer"] * 3
    for (_, preconditioned), (_, seen) in zip(events[::2], events[1::2]):
        assert preconditioned > 1.0 and seen == pytest.approx(1.0, rel=1e-4)


@pytest.mark.slow  # ~29 s; default suite: exact resume in tests/kaisa_ds/checkpoint/test_shards.py
def test_resume_from_checkpoint_continues_with_identical_losses(tmp_path: Path) -> None:
    got = _launch("resume", tmp_path)
    full, resumed = got["full"], got["resumed"]
    assert resumed["losses"] == full["losses"][2:]  # fp32: bit-identical
    assert resumed["kfac_steps"] == full["kfac_steps"] == 4
    for name, (a, g) in full["factors"].items():
        assert torch.equal(resumed["factors"][name][0], a) and torch.equal(resumed["factors"][name][1], g)
    tag = Path(got["checkpoint"]) / "global_step2"
    saved = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
    assert saved[SHARDS_KEY]["steps"] == 2 and saved[SHARDS_KEY]["world"] == 2  # the K-FAC state rides in shards
    assert (tag / META).is_file() and len(list(tag.glob("kfac_rank*_of_002.pt"))) == 2


@pytest.mark.slow  # ~25 s; default suite: the same drop under DeepSpeed in test_deepspeed_engine.py
def test_fp16_overflow_window_is_dropped_and_training_goes_on(tmp_path: Path) -> None:
    got = _launch("overflow", tmp_path)["trainer"]
    assert got["optimizer"] == "FP16_UnfusedOptimizer"  # the Trainer's fp16=True reached DeepSpeed's fp16 path
    assert got["skipped_windows"] == 1 and got["skipped_steps"] == 1
    assert got["losses"][1] == float("inf") and got["losses"][2] < got["losses"][0]
