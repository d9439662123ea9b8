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


class _FakeFP16Engine:
    def __init__(self, *, fp16: bool, optimizer: Any) -> None:
        self.optimizer, self._fp16 = optimizer, fp16
        self.seen: list[float] = []

    def fp16_enabled(self) -> bool:
        return self._fp16

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        self.seen.append(float(loss))
        return loss / 2  # like DeepSpeed with gradient_accumulation_steps = 2


class _Scaled:
    loss_scale = 256.0


def test_fp16_fix_is_gated_on_version_precision_and_zero() -> None:
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    plain = _FakeFP16Engine(fp16=True, optimizer=_Scaled())
    assert needs_fp16_fix(plain, "0.19.8") and needs_fp16_fix(plain, "0.19.8+cu121")
    assert not needs_fp16_fix(plain, "0.20.0") and not needs_fp16_fix(plain, "0.18.9")
    assert not needs_fp16_fix(_FakeFP16Engine(fp16=False, optimizer=_Scaled()), "0.19.8")
    zero = _FakeFP16Engine(fp16=True, optimizer=ZeROOptimizer.__new__(ZeROOptimizer))
    assert not needs_fp16_fix(zero, "0.19.8")


def test_fp16_fix_scales_the_backward_loss_and_returns_the_callers() -> None:
    engine = _FakeFP16Engine(fp16=True, optimizer=_Scaled())
    apply_fp16_fix(engine)
    returned = engine.backward(torch.tensor(3.0))
    assert engine.seen == [768.0] and float(returned) == pytest.approx(1.5)


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


def test_a_config_without_steps_per_print_trains() -> None:
    """DeepSpeed 0.19.8's default steps_per_print is None (the HF Trainer's configs set it, hand-written ones
    often do not); the step wrapper used to fail on it at the first boundary."""
    from tests.support.launch import run_distributed

    assert run_distributed(_train_without_steps_per_print, 1) == [2]
