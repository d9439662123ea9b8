"""In-process checks of the engine glue that need no DeepSpeed processes: start-up refusals raised by
kaisa_ds.initialize before DeepSpeed is touched, the fp16 fix's version gate, gradient access for the
BF16 optimizer's buffers, and the engine.step wrapper (auto, by hand, and both in one window)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kaisa_ds
from kaisa_ds import KFACConfig
from kaisa_ds.engine.deepspeed_engine import attach_kfac
from kaisa_ds.engine.fp16_fix import apply_fp16_fix, needs_fp16_fix
from kaisa_ds.engine.grad_access import EngineGradAccessor
from tests.support.models import TinyMLP

BASE = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}


@pytest.mark.parametrize(("extra", "message"), [
    ({"zero_optimization": {"stage": 3}, "kfac": {"enabled": True}}, "ZeRO stage 3"),
    ({"managed_gradient_accumulation": False, "kfac": {}}, "managed_gradient_accumulation"),
    ({"kfac": {"lr": 0.1}}, r"kfac\.lr"),
    ({"kfac": {"damping": 0}}, r"kfac\.damping=0(\.0)? .*allowed: > 0"),
    ({"kfac": {"inv_update_steps": {"initial": 10, "milestones": [5], "factr": 0.5}}}, r"kfac\.inv_update_steps"),
    ({"zero_optimization": {"stage": 1}, "optimizer": {"type": "Lamb", "params": {"lr": 0.1}}}, "trust ratio"),
    ({"kfac": {"lr_scale": 0}}, r"kfac\.lr_scale=0 .*a number > 0"),
])
def test_initialize_refuses_at_start_up(extra: dict, message: str) -> None:
    model = TinyMLP()
    with pytest.raises(ValueError, match=message):
        kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config={**BASE, **extra})


def test_initialize_refuses_a_lamb_instance_on_zero_partitions() -> None:
    from kaisa_ds.optim.lamb import Lamb

    model = TinyMLP()
    with pytest.raises(ValueError, match="trust ratio"):
        kaisa_ds.initialize(model=model, optimizer=Lamb(model.parameters(), lr=0.1),
                            config={**BASE, "zero_optimization": {"stage": 2}})


class _Scaled:
    loss_scale = 256.0


class _FakeFP16Engine:
    """DeepSpeed's fp16 ZeRO-0 ``engine.backward`` with accumulation 2: with the 0.19.x defect it never multiplies
    the loss by the loss scale (``scales=False``); a release that fixes it does (``scales=True``)."""

    def __init__(self, *, fp16: bool = True, optimizer: Any = None, scales: bool = False) -> None:
        self.optimizer, self._fp16, self.scales = optimizer or _Scaled(), fp16, scales
        self.weight = torch.nn.Parameter(torch.tensor(1.0))

    def fp16_enabled(self) -> bool:
        return self._fp16

    def gradient_accumulation_steps(self) -> int:
        return 2

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        loss = loss / 2 if scale_wrt_gas else loss
        (loss * self.optimizer.loss_scale if self.scales else loss).backward()
        return loss


def test_fp16_fix_is_gated_on_precision_zero_and_autocast() -> None:
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    assert needs_fp16_fix(_FakeFP16Engine())
    assert not needs_fp16_fix(_FakeFP16Engine(fp16=False))
    assert not needs_fp16_fix(_FakeFP16Engine(optimizer=ZeROOptimizer.__new__(ZeROOptimizer)))


@pytest.mark.parametrize("scales", [False, True], ids=["deepspeed-0.19.8", "a-release-that-fixes-it"])
def test_fp16_fix_scales_the_loss_exactly_once_whatever_deepspeed_does(scales: bool) -> None:
    """The fix follows what DeepSpeed's backward does (measured on the first call), not its version: a patch
    release that scales the loss itself must not get it scaled twice."""
    engine = _FakeFP16Engine(scales=scales)
    apply_fp16_fix(engine)
    for call in range(3):  # the first call measures, the later ones use what it found
        engine.weight.grad = None
        returned = engine.backward(engine.weight * 3.0)
        assert float(engine.weight.grad) == 256.0 * 3.0 / 2, call
        assert float(returned.detach()) == pytest.approx(1.5)  # the loss / accumulation, as DeepSpeed returns it
    engine.weight.grad = None
    engine.backward(engine.weight * 3.0, scale_wrt_gas=False)  # the HF Trainer's call
    assert float(engine.weight.grad) == 256.0 * 3.0


def test_bf16_optimizer_gradients_are_read_and_written_in_its_fp32_buffer() -> None:
    param = torch.nn.Parameter(torch.zeros(2, 3, dtype=torch.bfloat16))
    param.grad = torch.ones(2, 3, dtype=torch.bfloat16)  # the last micro-batch's local grad: must be ignored
    param._hp_grad = torch.arange(6.0)  # type: ignore[attr-defined]  # BF16_Optimizer's flat FP32 accumulator
    access = EngineGradAccessor(zero_stage=1)
    torch.testing.assert_close(access.get(param), torch.arange(6.0).view(2, 3))
    access.set(param, torch.full((2, 3), 7.0))
    torch.testing.assert_close(param._hp_grad, torch.full((6,), 7.0))  # type: ignore[attr-defined]
    assert bool((param.grad == 1).all())


class _FakeEngine:
    """The parts of a DeepSpeed engine the K-FAC glue uses, for one process and no accumulation."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.module, self.global_steps, self.monitor = model, 0, None
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def zero_optimization_stage(self) -> int:
        return 0

    def get_lr(self) -> list[float]:
        return [0.1]

    def is_gradient_accumulation_boundary(self) -> bool:
        return True

    def gradient_accumulation_steps(self) -> int:
        return 1

    def steps_per_print(self) -> int:
        return 1000

    def fp16_enabled(self) -> bool:
        return False

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.global_steps += 1

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None: ...

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> tuple[None, None]:
        return None, None


def _window(engine: _FakeEngine, *, by_hand: bool) -> None:
    x, y = torch.randn(8, 6), torch.randn(8, 4)
    F.mse_loss(engine.module(x), y).backward()
    if by_hand:
        engine.kfac.step()  # type: ignore[attr-defined]
    engine.step()


@pytest.mark.parametrize("auto_step", [True, False])
def test_step_wrapper_runs_kfac_once_per_window_also_when_called_by_hand(auto_step: bool) -> None:
    torch.manual_seed(0)
    engine = _FakeEngine(TinyMLP())
    engine.kfac = attach_kfac(engine, KFACConfig(damping=0.01), auto_step=auto_step)  # type: ignore[attr-defined]
    _window(engine, by_hand=True)  # by hand, then engine.step: one K-FAC step
    assert engine.kfac.steps == 1  # type: ignore[attr-defined]
    _window(engine, by_hand=False)  # engine.step alone: K-FAC runs only with auto_step
    assert engine.kfac.steps == (2 if auto_step else 1)  # type: ignore[attr-defined]


def _train_without_steps_per_print(rank: int, world: int) -> int:
    import os

    os.environ.setdefault("LOCAL_RANK", str(rank))  # deepspeed.initialize asks for it (gloo is already up)
    model = TinyMLP()
    cfg = {**BASE, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "kfac": {"damping": 0.01}}
    engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for _ in range(2):
        engine.backward(F.mse_loss(engine(torch.randn(2, 6)), torch.randn(2, 4)))
        engine.step()
    return int(engine.kfac.steps)


@pytest.mark.slow  # ~8 s
def test_a_config_without_steps_per_print_trains() -> None:
    """DeepSpeed 0.19.8's default steps_per_print is None (the HF Trainer's configs set it, hand-written ones
    often do not); the step wrapper used to fail on it at the first boundary."""
    from tests.support.launch import run_distributed

    assert run_distributed(_train_without_steps_per_print, 1) == [2]


def _engine_glue(rank: int, world: int) -> dict[str, Any]:
    """One DeepSpeed process for the engine glue the HF Trainer relies on (issue 22): the checkpoint wrappers keep
    DeepSpeed's signature, a second engine on one model leaves one set of hooks, a config without K-FAC says so,
    and torch_autocast fp16 (a GradScaler inside DeepSpeed) is divided out of K-FAC's statistics."""
    import inspect
    import logging
    import os

    os.environ.setdefault("LOCAL_RANK", str(rank))
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kaisa_ds").addHandler(handler)
    sgd = {"type": "SGD", "params": {"lr": 0.1}}
    out: dict[str, Any] = {}
    torch.manual_seed(0)
    model = TinyMLP()
    x, y = torch.randn(2, 6), torch.randn(2, 4)
    cfg = {**BASE, "optimizer": sgd, "kfac": {"damping": 0.01}}
    engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    out["save_params"] = list(inspect.signature(engine.save_checkpoint).parameters)
    out["hooks_first"] = len(model.fc1._forward_hooks)
    engine.backward(F.mse_loss(engine(x), y))
    engine.step()
    out["g_fp32"] = engine.kfac.layers["fc1"].g_factor.clone()
    kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=cfg)  # auto_find_batch_size's retry
    out["hooks_second"] = len(model.fc1._forward_hooks)
    messages.clear()
    kaisa_ds.initialize(model=TinyMLP(), config={**BASE, "optimizer": sgd})
    out["no_section"] = list(messages)
    messages.clear()
    kaisa_ds.initialize(model=TinyMLP(), config={**BASE, "optimizer": sgd, "kfac": {"enabled": False}})
    out["disabled"] = list(messages)
    torch.manual_seed(0)
    model = TinyMLP()
    auto = {**cfg, "torch_autocast": {"enabled": True, "dtype": "fp16"}}
    engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=auto)
    out["autocast_scale"] = (engine.kfac.loss_scale(), float(engine.torch_autocast_z0_gradscaler.get_scale()))
    engine.backward(F.mse_loss(engine(x), y))
    engine.step()
    out["g_autocast"] = engine.kfac.layers["fc1"].g_factor.clone()
    # kfac.lr_scale: the same first step at half the rate, the scheduler's rate reported unscaled, the KL clip's
    # rate scaled (a warm-up scheduler that DeepSpeed steps after the optimizer)
    warm = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 0.2, "warmup_num_steps": 4,
                                          "warmup_type": "linear"}}
    for scale in (1.0, 0.5):
        torch.manual_seed(0)
        model = TinyMLP()
        before = model.fc1.weight.detach().clone()
        rated = {**cfg, "scheduler": warm, "kfac": {"damping": 0.01, "lr_scale": scale}}
        engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=rated)
        lr_before = engine.get_lr()[0]
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()
        moved = (model.fc1.weight.detach() - before).norm().item()
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()  # DeepSpeed's WarmupLR leaves its minimum on the second step
        out[f"rate_{scale:g}"] = (moved, lr_before, engine.get_lr()[0], engine.kfac.config.value("lr", 0))
    # an inf only in a layer K-FAC skips: the GradScaler (ZeRO-0 on the engine, ZeRO-1 on the optimizer) skips the
    # step, and K-FAC must drop its window too
    for stage, by_hand in ((0, False), (1, False), (0, True)):
        torch.manual_seed(0)
        model = TinyMLP()
        model.fc1.weight.register_hook(lambda grad: grad * float("inf"))
        kfac = {"damping": 0.01, "skip_layers": ["fc1"], "auto_step": not by_hand}
        skip = {**auto, "kfac": kfac, "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
        engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config=skip)
        before = model.fc2.weight.detach().clone()
        engine.backward(F.mse_loss(engine(x), y))
        if by_hand:
            engine.kfac.step()
        engine.step()
        key = f"autocast_overflow_z{stage}" + ("_by_hand" if by_hand else "")
        out[key] = (engine.kfac.skipped_windows, bool(torch.equal(before, model.fc2.weight)),
                    engine.kfac.loss_scale() > 1.0)
    return out


@pytest.fixture(scope="module")
def glue() -> dict[str, Any]:
    from tests.support.launch import run_distributed

    return run_distributed(_engine_glue, 1)[0]  # type: ignore[no-any-return]


def test_lr_scale_steps_the_optimizer_at_a_factor_of_the_scheduled_rate(glue: dict[str, Any]) -> None:
    moved, lr_before, lr_after, clip_lr = glue["rate_0.5"]
    plain_moved, plain_before, plain_after, plain_clip_lr = glue["rate_1"]
    assert moved == pytest.approx(0.5 * plain_moved, rel=1e-5)  # the same preconditioned gradient, half the rate
    assert (lr_before, lr_after) == (plain_before, plain_after) and lr_after > lr_before  # the scheduler unscaled
    assert clip_lr == pytest.approx(0.5 * plain_clip_lr)


def test_checkpoint_wrappers_keep_deepspeeds_signature(glue: dict[str, Any]) -> None:
    """The HF Trainer passes exclude_frozen_parameters=True (PEFT checkpoints without the frozen base) only when
    the engine's save_checkpoint signature names it."""
    assert "exclude_frozen_parameters" in glue["save_params"]


def test_a_second_engine_on_the_same_model_removes_the_first_preconditioners_hooks(glue: dict[str, Any]) -> None:
    assert glue["hooks_first"] == glue["hooks_second"] == 1


@pytest.mark.parametrize(("key", "why"), [("no_section", "no \"kfac\" section"), ("disabled", "\"enabled\": false")])
def test_a_config_without_enabled_kfac_warns_that_kfac_is_off(glue: dict[str, Any], key: str, why: str) -> None:
    assert any("K-FAC is OFF" in m and why in m for m in glue[key]), glue[key]


@pytest.mark.parametrize("case", ["z0", "z1", "z0_by_hand"])
def test_torch_autocast_fp16_overflow_outside_kfacs_layers_drops_the_window(glue: dict[str, Any], case: str) -> None:
    skipped_windows, step_skipped, scaled = glue[f"autocast_overflow_{case}"]
    assert step_skipped and skipped_windows == 1 and scaled


def test_torch_autocast_fp16_loss_scale_is_divided_out_of_the_factors(glue: dict[str, Any]) -> None:
    kfac_scale, scaler_scale = glue["autocast_scale"]
    assert kfac_scale == scaler_scale > 1.0
    fp32, autocast = glue["g_fp32"], glue["g_autocast"]
    assert (autocast - fp32).abs().max() <= 1e-2 * fp32.abs().max()  # fp16 rounding of the backward only


def test_save_on_each_node_is_refused_across_nodes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each node's disk would hold only its own ranks' K-FAC shards, while a resume reads every rank's."""
    from types import SimpleNamespace

    from kaisa_ds.hf.trainer import check_node_local_checkpoints

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="save_on_each_node=True on several nodes"):
        check_node_local_checkpoints(SimpleNamespace(save_on_each_node=True, world_size=4))
    check_node_local_checkpoints(SimpleNamespace(save_on_each_node=True, world_size=2))  # one node: fine
    check_node_local_checkpoints(SimpleNamespace(save_on_each_node=False, world_size=4))
