"""Misuse of the preconditioner gets a clear error or an explicit warning, and leaves it usable (issue 10)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kaisa_ds import KFACConfig, KFACPreconditioner
from tests.support.models import TinyMLP, TinyTransformerish, TinyWithUnusedHead


def _backward(model: nn.Module, x: torch.Tensor) -> None:
    model.zero_grad()
    model(x).pow(2).mean().backward()


def test_step_before_any_forward_raises_and_leaves_the_preconditioner_usable() -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, damping=0.01)
    with pytest.raises(RuntimeError, match="forward"):
        precond.step()
    assert set(precond.layers) == {"fc1", "fc2"}  # nothing was dropped by the failed step
    assert precond.steps == 0
    _backward(model, torch.randn(8, 6))
    raw = model.fc1.weight.grad.clone()
    precond.step()
    assert precond.steps == 1 and set(precond.layers) == {"fc1", "fc2"}
    assert not torch.allclose(model.fc1.weight.grad, raw)  # preconditioned, hooks still attached


def test_step_twice_after_one_backward_does_not_precondition_twice(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, damping=0.01, kl_clip=None)
    _backward(model, torch.randn(8, 6))
    precond.step()
    once = {n: p.grad.clone() for n, p in model.named_parameters()}
    with caplog.at_level(logging.WARNING):
        precond.step()
    assert "already preconditioned" in caplog.text
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, once[n])
    assert precond.steps == 1
    _backward(model, torch.randn(8, 6))  # a new backward is preconditioned as usual
    precond.step()
    assert precond.steps == 2


def test_step_after_a_forward_without_backward_raises_and_keeps_the_counter() -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, damping=0.01)
    model(torch.randn(8, 6))
    with pytest.raises(RuntimeError, match="backward"):
        precond.step()
    assert precond.steps == 0
    _backward(model, torch.randn(8, 6))
    precond.step()
    assert precond.steps == 1


def test_fractional_update_interval_in_a_config_section_is_refused() -> None:
    with pytest.raises(ValueError, match=r"kfac\.factor_update_steps"):
        KFACConfig.from_dict({"factor_update_steps": 2.5})
    with pytest.raises(ValueError, match=r"kfac\.inv_update_steps"):
        KFACConfig.from_dict({"inv_update_steps": {"initial": 10.5}})
    assert KFACConfig.from_dict({"factor_update_steps": 2.0}).value("factor_update_steps", 0) == 2


class _BareAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x)[0]


def test_a_model_whose_only_layer_is_never_called_names_it() -> None:
    model = _BareAttention()
    precond = KFACPreconditioner(model)
    model(torch.randn(2, 3, 8)).sum().backward()
    with pytest.raises(RuntimeError, match=r"attn\.out_proj.*not called as a module"):
        precond.step()


@pytest.mark.parametrize("fraction", [1.0, "mem-opt"])
def test_a_layer_without_gradient_is_left_alone(fraction: float | str) -> None:
    torch.manual_seed(0)
    model = TinyWithUnusedHead()
    precond = KFACPreconditioner(model, damping=0.01, grad_worker_fraction=fraction)
    _train_steps(model, precond, 3)
    assert model.head.weight.grad is None and model.body.out.weight.grad is not None


def _train_steps(model: nn.Module, precond: KFACPreconditioner, steps: int) -> None:
    for _ in range(steps):
        model.zero_grad()
        F.mse_loss(model(torch.randint(0, 11, (4, 5))), torch.randn(4, 5, 5)).backward()
        precond.step()


def _trained_state() -> tuple[nn.Module, KFACPreconditioner, dict]:
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, damping=0.01, kl_clip=None)
    _train_steps(model, precond, 2)
    return model, precond, precond.state_dict()


def test_a_state_without_factors_is_refused_by_name() -> None:
    _model, precond, state = _trained_state()
    del state["factors"]
    with pytest.raises(ValueError, match="factors"):
        precond.load_state_dict(state)


def test_a_non_finite_factor_in_a_state_is_refused_by_name() -> None:
    _model, precond, state = _trained_state()
    name = next(n for n, f in state["factors"].items() if f["value"] is not None and f["value"].dim() == 2)
    state["factors"][name]["value"][0, 0] = float("nan")
    with pytest.raises(ValueError, match=rf"{name}.*not finite"):
        precond.load_state_dict(state)


def test_a_factor_of_the_wrong_shape_is_refused_by_name() -> None:
    _model, precond, state = _trained_state()
    name = next(n for n, f in state["factors"].items() if f["value"] is not None and f["value"].dim() == 2)
    state["factors"][name]["value"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=rf"{name}.*shape"):
        precond.load_state_dict(state)


def test_a_non_finite_decomposition_is_recomputed_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    model, precond, state = _trained_state()
    name = next(iter(state["decompositions"]))
    state["decompositions"][name][0].fill_(float("nan"))
    with caplog.at_level(logging.WARNING):
        precond.load_state_dict(state)
    assert name in caplog.text and "recomputed" in caplog.text
    model.zero_grad()
    F.mse_loss(model(torch.randint(0, 11, (4, 5))), torch.randn(4, 5, 5)).backward()
    precond.step()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_an_error_while_loading_leaves_the_preconditioner_as_it_was() -> None:
    model, precond, state = _trained_state()
    bad = dict(state)
    bad["factors"] = {n: dict(f) for n, f in state["factors"].items()}
    name = next(n for n, f in bad["factors"].items() if f["value"] is not None)
    bad["factors"][name]["value"] = torch.full_like(bad["factors"][name]["value"], float("inf"))
    before = precond.state_dict()
    with pytest.raises(ValueError):
        precond.load_state_dict(bad)
    after = precond.state_dict()
    assert after["steps"] == before["steps"]
    for n, f in before["factors"].items():
        assert torch.equal(after["factors"][n]["value"], f["value"])
    model.zero_grad()
    F.mse_loss(model(torch.randint(0, 11, (4, 5))), torch.randn(4, 5, 5)).backward()
    precond.step()  # still works


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_step_called_inside_autocast_preconditions_as_outside(dtype: torch.dtype) -> None:
    """A loop that calls ``precond.step()`` inside its ``torch.autocast`` block must get the same FP32 step: the
    step's matmuls (preconditioning, KL clip) were autocast to half precision, 0.79 of the gradient's size off in
    bf16 (the twin of the statistics fix found on the H100)."""
    torch.manual_seed(0)
    model = TinyMLP()
    x = torch.randn(32, 6)

    def grads(inside: bool) -> list[torch.Tensor]:
        m = copy.deepcopy(model)
        precond = KFACPreconditioner(m, factor_update_steps=1, inv_update_steps=1, damping=0.01, lr=0.1)
        m(x).pow(2).mean().backward()
        if inside:
            with torch.autocast("cpu", dtype=dtype):
                precond.step()
        else:
            precond.step()
        return [p.grad.clone() for p in m.parameters() if p.grad is not None]

    for outside, inside in zip(grads(False), grads(True)):
        torch.testing.assert_close(inside, outside, rtol=1e-5, atol=1e-7)
