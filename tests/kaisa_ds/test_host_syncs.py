"""A plain K-FAC step (no statistics, no decomposition) never waits for the device: the host reads no tensor value
(its finiteness check is read a step late), counted on the CPU as a GPU would sync; a non-finite gradient on a plain
step is still left as it came and counted as skipped."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds import KFACPreconditioner
from tests.support.models import masked_lm_examples, tiny_bert_mlm
from tests.support.syncs import HostSyncs, Launches


def _batch() -> dict[str, torch.Tensor]:
    examples = masked_lm_examples(8)
    return {k: torch.stack([e[k] for e in examples]) for k in examples[0]}


def _steps(precond: KFACPreconditioner, model: torch.nn.Module, count: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(count):
        opt.zero_grad()
        model(**_batch()).loss.backward()
        precond.step()
        opt.step()


@pytest.mark.parametrize("grafting", ["gradient", "none"])
def test_a_plain_step_reads_no_tensor_value(grafting: str) -> None:
    model = tiny_bert_mlm()
    precond = KFACPreconditioner(model, factor_update_steps=5, inv_update_steps=10, grafting=grafting)
    _steps(precond, model, 2)  # step 0 decomposes; step 1 is plain
    model.zero_grad()
    model(**_batch()).loss.backward()
    with HostSyncs() as syncs, Launches() as launches:
        precond.step()  # step 2: plain
    assert syncs.calls == [], syncs.calls
    layers = len(precond.layers)
    assert 0 < launches.count < 40 * layers, launches.count  # batched: not dozens of kernels per layer
    model.zero_grad()
    model(**_batch()).loss.backward()
    with HostSyncs() as factor_step:
        _steps(precond, model, 3)  # steps 3, 4 plain; step 5 a factor update: it may sync
    assert factor_step.calls, "a factor step checks its statistics on the host"


def test_a_non_finite_gradient_on_a_plain_step_is_left_as_it_came_and_counted() -> None:
    model = tiny_bert_mlm()
    precond = KFACPreconditioner(model, factor_update_steps=5, inv_update_steps=10)
    _steps(precond, model, 2)
    model.zero_grad()
    model(**_batch()).loss.backward()
    weight = next(iter(precond.layers.values())).helper.weight
    weight.grad[0, 0] = float("inf")
    before = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    precond.step()
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.equal(p.grad, before[n]), n
    assert precond.skipped_windows == 1 and precond.steps == 3
