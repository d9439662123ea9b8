"""kaisa_ds.initialize under the deepspeed launcher on 2 CPU ranks: every precision and ZeRO stage, overflow,
clipping order, checkpoints (also across a world-size change) and the monitor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kaisa_ds import KFACPreconditioner
from kaisa_ds.checkpoint.shards import META, assemble, read_meta
from kaisa_ds.engine.checkpoint import CLIENT_KEY, SHARDS_KEY
from tests.kaisa_ds.engine import ds_worker
from tests.support.launch import run_deepspeed
from tests.support.models import TinyTransformerish
from tests.support.training import train_steps

WORKER = str(Path(ds_worker.__file__))
KFAC: dict[str, Any] = {"damping": 0.01, "kl_clip": 0.05, "factor_decay": 0.9, "inv_update_steps": 2,
                        "grafting": "none"}  # KAISA's step: the clip below acts on its own sizes


def _launch(scenario: str, tmp_path: Path, *, ranks: int = 2, ckpt: Path | None = None) -> dict:
    out = tmp_path / scenario
    args = [WORKER, scenario, str(out)] + (["--ckpt", str(ckpt)] if ckpt else [])
    proc = run_deepspeed(args, num_ranks=ranks)
    # kaisa_ds.init_distributed keeps DeepSpeed from JIT-building its CPU shm op (minutes, needs a compiler)
    assert "shm_comm" not in proc.stdout + proc.stderr, "DeepSpeed built or loaded its CPU shm op"
    return torch.load(f"{out}.rank0.pt", weights_only=False)


def _single_process_reference(steps: int) -> tuple[list[float], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """The same global batches in one process and one pass: what every mode must reproduce."""
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, lr=0.1, **KFAC)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = train_steps(model, precond, opt, (ds_worker.global_batch(step) for step in range(steps)))
    return losses, {n: (ly.a_factor, ly.g_factor) for n, ly in precond.layers.items()
                    if ly.a_factor is not None and ly.g_factor is not None}


@pytest.fixture(scope="module")
def modes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _launch("modes", tmp_path_factory.mktemp("modes"))


TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "bf16acc32": 3e-2, "fp16": 5e-3}


@pytest.mark.parametrize("mode", ["fp32-z0", "fp32-z1", "fp32-z2", "bf16-z0", "bf16-z2", "bf16acc32-z1",
                                  "fp16-z0", "fp16-z1", "fp16-z2", "manual"])
def test_every_mode_matches_the_single_process_reference(modes: dict, mode: str) -> None:
    """Factors and losses do not depend on world size, micro-batch split, accumulation or loss scale."""
    losses, factors = _single_process_reference(2)
    got = modes[mode]
    tol = TOLERANCE[mode.split("-")[0]] if mode != "manual" else 1e-4
    assert got["steps"] == 2 and got["skipped_windows"] == 0
    assert got["losses"] == pytest.approx(losses, rel=tol)
    for name, (a, g) in factors.items():
        ga, gg = got["factors"][name]
        assert (ga - a).abs().max() <= tol * a.abs().max(), f"{mode} {name} A"
        assert (gg - g).abs().max() <= tol * g.abs().max(), f"{mode} {name} G"
    expected = {"fp32-z0": "SGD", "bf16acc32-z1": "BF16_Optimizer", "fp16-z0": "FP16_UnfusedOptimizer",
                "fp16-z1": "DeepSpeedZeroOptimizer"}
    if mode in expected:
        assert got["optimizer"] == expected[mode]  # the gradient path under test really is that one


def test_fp16_overflow_drops_the_window_on_every_rank(tmp_path: Path) -> None:
    results = _launch("overflow", tmp_path)
    for mode, got in results.items():
        assert got["skipped_windows"] == 1 and got["skipped_steps"] == 1, mode
        assert got["steps"] == 3
        for a, g in got["factors"].values():
            assert torch.isfinite(a).all() and torch.isfinite(g).all()
        assert got["losses"][2] < got["losses"][0]  # training went on after the skipped step


@pytest.mark.slow  # ~17 s; default suite: clipping through the Trainer in tests/kaisa_ds/hf/test_hf_trainer.py
def test_gradient_clipping_applies_to_preconditioned_gradients(tmp_path: Path) -> None:
    got = _launch("clip", tmp_path)["clip"]
    for record in got["captured"]:
        grads = record["grads"]
        norm = torch.sqrt(sum((g**2).sum() for g in grads.values()))
        coef = min(1.0, 0.01 / (float(norm) + 1e-6))
        assert coef < 1.0  # clipping is active in this scenario
        for name, g in grads.items():
            delta = record["after"][name] - record["before"][name]
            torch.testing.assert_close(delta, -0.1 * coef * g, rtol=1e-3, atol=1e-7)


def _as_previous_format(tag: Path) -> None:
    """Rewrite a sharded checkpoint as the code before the sharded format wrote it: the gathered state inside
    DeepSpeed's client state, no shard files."""
    states = tag / "mp_rank_00_model_states.pt"
    saved = torch.load(states, weights_only=False)
    assert SHARDS_KEY in saved and CLIENT_KEY not in saved  # nothing large rides in the model-states file
    gathered = assemble(tag, read_meta(tag), decompositions=lambda f: True)
    saved[CLIENT_KEY] = gathered
    del saved[SHARDS_KEY]
    torch.save(saved, states)
    for path in [*tag.glob("kfac_rank*.pt"), tag / META]:
        path.unlink()


@pytest.mark.slow  # ~100 s; default suite: exact resume across world sizes in tests/kaisa_ds/checkpoint/test_shards.py
def test_checkpoint_resume_is_identical_also_on_another_world_size_and_refuses_other_models(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    full = _launch("save", tmp_path, ckpt=ckpt)
    assert sorted(p.name for p in (ckpt / "mid").glob("kfac_*")) == sorted(
        ["kfac_meta.json", "kfac_rank000_of_002.pt", "kfac_rank001_of_002.pt"])
    same = _launch("resume", tmp_path, ckpt=ckpt)
    assert same["losses"] == full["losses"][2:] and same["kfac_steps"] == 4
    one_rank = _launch("resume", tmp_path, ranks=1, ckpt=ckpt)  # 2 -> 1: one rank reads both shards
    assert one_rank["losses"] == pytest.approx(full["losses"][2:], rel=1e-5)
    wrong = _launch("wrong", tmp_path, ranks=1, ckpt=ckpt)
    assert wrong["other_shapes"] is not None and "different model" in wrong["other_shapes"]
    assert wrong["other_kfac_layers"] is not None and "does not match this model" in wrong["other_kfac_layers"]
    shard = ckpt / "mid" / "kfac_rank001_of_002.pt"
    content = torch.load(shard, weights_only=True)
    name = next(n for n, f in content["factors"].items() if f["value"] is not None)
    content["factors"][name]["value"].view(-1)[0] = float("nan")  # a flipped bit in the file
    torch.save(content, shard)
    corrupt = _launch("wrong", tmp_path, ranks=1, ckpt=ckpt)["same_model"]
    assert corrupt is not None and str(shard) in corrupt  # its new size no longer matches the index


@pytest.mark.slow  # ~65 s; default suite: tests/kaisa_ds/checkpoint/test_state.py resumes two ranks' state on one
def test_checkpoint_from_one_rank_resumes_on_two_and_the_previous_format_still_loads(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    full = _launch("save", tmp_path, ranks=1, ckpt=ckpt)
    two = _launch("resume", tmp_path, ckpt=ckpt)  # 1 -> 2: both ranks read the one shard
    assert two["losses"] == pytest.approx(full["losses"][2:], rel=1e-5) and two["kfac_steps"] == 4
    _as_previous_format(ckpt / "mid")
    old = _launch("resume", tmp_path, ranks=1, ckpt=ckpt)
    assert old["losses"] == full["losses"][2:] and old["kfac_steps"] == 4


@pytest.mark.slow  # ~17 s; default suite: the metrics in tests/kaisa_ds/hf/test_hf_trainer_modes.py
def test_monitor_receives_kfac_timings(tmp_path: Path) -> None:
    _launch("monitor", tmp_path, ckpt=tmp_path / "monitor")
    files = {p.name for p in (tmp_path / "monitor").rglob("*.csv")}
    for stage in ("factor_capture", "factor_reduction", "decomposition", "preconditioning"):
        assert f"Train_KFAC_{stage}_ms.csv" in files
    assert "Train_KFAC_factors_MB.csv" in files
