"""Every family of the zoo (tests/support/zoo.py) attaches K-FAC, has >= 80% of its untied linear-like parameters
preconditioned with no coverage warning (or, for the families whose layers K-FAC cannot see, the warning names what
is left out), K-FAC changes its gradients, and its loss falls on a real-text batch from ../shared/data (WikiText-2
valid) with K-FAC's defaults."""

from __future__ import annotations

import logging

import pytest
import torch

from kaisa_ds import KFACPreconditioner
from tests.support.bert_data import SHARED_ABSENT, real_data_present
from tests.support.zoo import FAMILIES, batch

pytestmark = pytest.mark.skipif(not real_data_present(), reason=SHARED_ABSENT)
STEPS = 10
MIN_DROP = 0.5  # nats the loss must fall over STEPS steps on its batch (measured 1.3-3.3 across the zoo)


def _flat_grads(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).float() for p in params if p.grad is not None])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_attaches_is_preconditioned_and_learns(family: str, caplog: pytest.LogCaptureFixture) -> None:
    spec = FAMILIES[family]
    torch.manual_seed(0)
    model = spec.build()
    model.train()
    precond = KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=2)  # every other default
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = batch(spec.task)
    losses, cosines = [], []
    with caplog.at_level(logging.WARNING, logger="kaisa_ds"):
        for _ in range(STEPS):
            opt.zero_grad()
            loss = model(**data).loss
            loss.backward()
            params = [p for ly in precond.layers.values() for p in (ly.helper.weight, ly.helper.bias) if p is not None]
            raw = _flat_grads(model, params)
            precond.step()
            pre = _flat_grads(model, params)
            cosines.append(float(torch.nn.functional.cosine_similarity(raw, pre, dim=0)))
            opt.step()
            losses.append(loss.item())
    coverage = precond.coverage
    if spec.unsupported:  # the warning must name what is left out (its share may still be >= 80%)
        assert coverage.heavy_unsupported(), coverage.lines()
        warned = [r.getMessage() for r in caplog.records if "does not precondition" in r.getMessage()]
        assert warned and all(t.split(" (")[0] in warned[0] for t in coverage.heavy_unsupported()), warned
    else:
        assert coverage.linear_share >= 0.8, coverage.lines()
        assert not [r for r in caplog.records if "does not precondition" in r.getMessage()]
    assert precond.diagnostics_snapshot()["coverage"]["linear_share"] == pytest.approx(coverage.linear_share, abs=1e-4)
    assert min(cosines) < 0.999, cosines  # K-FAC turned the gradient: it is not silently off
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[0] - losses[-1] >= MIN_DROP, losses
