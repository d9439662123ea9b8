"""K-FAC's rate factor: the optimizer steps at ``c`` × its scheduled rate, and every scheduler (one that recomputes
from its base rates, one that chains on the current rate) reads and sets unscaled rates."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds.engine.rate_scale import check_lr_scale, scale_optimizer_rate


def _sgd(lr: float = 0.1) -> tuple[torch.nn.Parameter, torch.optim.SGD]:
    weight = torch.nn.Parameter(torch.zeros(3))
    return weight, torch.optim.SGD([weight], lr=lr)


def _step(weight: torch.nn.Parameter, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    before = weight.detach().clone()
    weight.grad = torch.ones(3)
    optimizer.step()
    return weight.detach() - before


def test_a_step_moves_by_the_factor_and_leaves_the_scheduled_rate() -> None:
    weight, optimizer = _sgd()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    scale_optimizer_rate(optimizer, 0.25)
    for step in range(3):
        scheduled = optimizer.param_groups[0]["lr"]
        assert scheduled == pytest.approx(0.1 / (1 + step))
        assert _step(weight, optimizer) == pytest.approx(torch.full((3,), -0.25 * scheduled))
        assert optimizer.param_groups[0]["lr"] == scheduled  # restored before the scheduler steps
        scheduler.step()


def test_a_chainable_scheduler_does_not_compound_the_factor() -> None:
    weight, optimizer = _sgd()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scale_optimizer_rate(optimizer, 0.5)
    moves = []
    for _ in range(3):
        moves.append(float(-_step(weight, optimizer)[0]))
        scheduler.step()
    assert moves == pytest.approx([0.05, 0.025, 0.0125])
    assert scheduler.get_last_lr() == pytest.approx([0.0125])


class _Failing(torch.optim.SGD):
    fail = False

    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        if self.fail:
            raise RuntimeError("the step failed")
        return super().step(closure)


def test_a_failing_step_restores_the_rate_and_a_second_wrap_replaces_the_factor() -> None:
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer = _Failing([weight], lr=0.1)
    scale_optimizer_rate(optimizer, 0.5)
    scale_optimizer_rate(optimizer, 0.2)  # a second engine on the same optimizer
    assert _step(weight, optimizer) == pytest.approx(torch.full((3,), -0.02))
    optimizer.fail = True
    with pytest.raises(RuntimeError, match="the step failed"):
        optimizer.step()
    assert optimizer.param_groups[0]["lr"] == 0.1
    optimizer.fail = False
    scale_optimizer_rate(optimizer, 1.0)  # back to the plain step
    assert _step(weight, optimizer) == pytest.approx(torch.full((3,), -0.1))


@pytest.mark.parametrize("bad", [0, -0.5, True, "0.5", None])
def test_a_bad_factor_names_the_key(bad: object) -> None:
    with pytest.raises(ValueError, match=r"kfac\.lr_scale=.* a number > 0"):
        check_lr_scale(bad)
    with pytest.raises(ValueError, match=r"kfac\.lr_scale=0\.5 needs the engine's optimizer"):
        scale_optimizer_rate(None, 0.5)
