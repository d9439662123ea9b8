"""The coverage report: what share of a model K-FAC preconditions, and a warning naming the module type when a type
it does not precondition holds more than 5% of the trainable parameters (never silently off for most of a model)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from kaisa_ds import KFACPreconditioner


class Experts(nn.Module):
    """Mixture-of-experts weights held as one 3-D parameter (as transformers' fused experts): no K-FAC layer."""

    def __init__(self, experts: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(experts, dim, dim) / dim**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bd,edf->bf", x, self.weight) / self.weight.shape[0]


class Mostly(nn.Module):
    def __init__(self, experts: int) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.experts = Experts(experts, 8)
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.experts(torch.relu(self.inp(x)))))


def _first_step(model: nn.Module, caplog: pytest.LogCaptureFixture) -> tuple[KFACPreconditioner, list[str]]:
    precond = KFACPreconditioner(model)
    with caplog.at_level(logging.INFO, logger="kaisa_ds"):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        precond.step()
    return precond, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_unsupported_type_holding_most_parameters_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    precond, warnings = _first_step(Mostly(experts=8), caplog)
    cov = precond.coverage
    assert cov.trainable == 72 + 512 + 16 + 18 and cov.preconditioned == 72 + 18
    assert cov.by_type()["Experts"] == {"unsupported type": 512}
    assert cov.by_type()["LayerNorm"] == {"1-D parameters": 16}
    assert cov.linear_share == pytest.approx(90 / 602)
    named = "does not precondition Experts (unsupported type) (83% of the trainable"
    assert any(named in w for w in warnings), warnings
    assert "K-FAC preconditions 90 of 618 trainable parameters" in caplog.text  # the table, at info level
    assert precond.diagnostics_snapshot()["coverage"]["heavy_unsupported"] == {"Experts (unsupported type)": 512}


def test_a_small_unsupported_share_is_reported_but_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    model = Mostly(experts=1)
    model.inp = nn.Linear(8, 128)
    model.experts = Experts(1, 8)
    model.experts.weight = nn.Parameter(torch.randn(1, 128, 8) / 128**0.5)
    model.norm = nn.LayerNorm(8)
    model.out = nn.Linear(8, 4000)  # 36,000 parameters: the experts hold 1,024 of 38,192 (2.7%)
    precond, warnings = _first_step(model, caplog)
    assert precond.coverage.heavy_unsupported() == {}
    assert not any("does not precondition" in w for w in warnings), warnings
    assert precond.coverage.by_type()["Experts"] == {"unsupported type": 1024}
