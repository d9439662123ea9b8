"""state_dict round trips resume training identically, and refuse another model's state."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds import KFACPreconditioner
from tests.support.launch import run_distributed
from tests.support.models import TinyMLP, TinyTransformerish
from tests.support.training import train_steps

STEPS, SPLIT = 8, 5


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 11, (4, 5), generator=g), torch.randn(4, 5, 5, generator=g)) for _ in range(STEPS)]


def _make() -> tuple[TinyTransformerish, KFACPreconditioner, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, factor_update_steps=2, inv_update_steps=3, damping=0.01, lr=0.05,
                                 grad_worker_fraction="mem-opt")
    return model, precond, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def test_resume_from_state_dict_is_identical() -> None:
    data = _data()
    full = train_steps(*_make(), data)
    model, precond, opt = _make()
    first = train_steps(model, precond, opt, data[:SPLIT])
    saved = {"model": model.state_dict(), "opt": opt.state_dict(), "kfac": precond.state_dict()}
    model2, precond2, opt2 = _make()
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    precond2.load_state_dict(saved["kfac"])
    assert precond2.steps == SPLIT
    rest = train_steps(model2, precond2, opt2, data[SPLIT:])
    assert first + rest == full  # bit-identical in fp32 on CPU


def test_state_from_another_model_is_refused() -> None:
    model, precond, opt = _make()
    train_steps(model, precond, opt, _data()[:1])
    other = KFACPreconditioner(TinyMLP())
    with pytest.raises(ValueError, match="does not match this model"):
        other.load_state_dict(precond.state_dict())
    with pytest.raises(ValueError, match="not a kaisa_ds K-FAC state"):
        other.load_state_dict({"steps": 3})


def _save_distributed(rank: int, world: int) -> dict:
    model, precond, opt = _make()
    train_steps(model, precond, opt, _data()[:SPLIT])  # identical data on every rank: same grads as 1 process
    return precond.state_dict()


def test_state_saved_on_two_ranks_resumes_on_one() -> None:
    states = run_distributed(_save_distributed, 2)
    for key in states[0]["decompositions"]:  # gathered: every rank returns every decomposition
        for a, b in zip(states[0]["decompositions"][key], states[1]["decompositions"][key]):
            assert torch.equal(a, b)
    data = _data()
    full = train_steps(*_make(), data)
    model, precond, opt = _make()
    train_steps(model, precond, opt, data[:SPLIT])
    precond.load_state_dict(states[0])
    torch.testing.assert_close(
        train_steps(model, precond, opt, data[SPLIT:]), full[SPLIT:], rtol=1e-5, atol=1e-7)
