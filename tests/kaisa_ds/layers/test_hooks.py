"""Hooks capture only training passes with grad, and notice layers reading the same input tensor."""

from __future__ import annotations

import torch

from kaisa_ds import KFACPreconditioner
from tests.support.models import TinyTransformerish
from tests.support.training import EVERY_STEP


def test_eval_and_no_grad_passes_are_not_captured() -> None:
    model = TinyTransformerish()
    precond = KFACPreconditioner(model)
    ids = torch.randint(0, 11, (2, 3))
    with torch.no_grad():
        model(ids)
    model.eval()
    model(ids).sum().backward()
    assert not any(f.has_window for f in precond.factors().values())
    model.train()
    model(ids).sum().backward()
    assert all(f.has_window for f in precond.factors().values())


def test_query_key_value_share_one_a_factor_counted_once() -> None:
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, **EVERY_STEP)
    ids = torch.randint(0, 11, (2, 3))
    model(ids).sum().backward()
    assert precond.capture.same_input == {"key": "query", "value": "query"}
    precond.step()
    a = precond.layers["query"].a
    assert precond.layers["key"].a is a and precond.layers["value"].a is a
    assert len(precond.factors()) == 2 * 5 - 2  # 5 layers, two A factors folded into query's
    model.zero_grad()
    model(ids).sum().backward()
    assert a.passes == 1  # the shared input was counted once, not three times


def test_factor_update_interval_limits_capture() -> None:
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, factor_update_steps=3)
    ids = torch.randint(0, 11, (2, 3))
    captured = []
    for _ in range(6):
        model.zero_grad()
        model(ids).sum().backward()
        captured.append(precond.layers["out"].g.has_window)
        precond.step()
    assert captured == [True, False, False, True, False, False]


def test_the_batch_size_is_read_from_the_models_first_tensor_input_also_inside_a_batch_dict() -> None:
    """The noise scale counts samples by the batch dimension of the model's input: a tensor argument, a keyword, or
    the first tensor of a batch dict (bert_pretrain's wrapper takes one)."""
    from torch import nn

    from kaisa_ds.layers.hooks import HookCapture

    class TakesADict(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return self.fc(batch["x"])

    model = TakesADict()
    capture = HookCapture(enabled=lambda: True, on_input=lambda *a: None, on_output_grad=lambda *a: None)
    capture.attach_model(model)
    model({"mask": torch.ones(5, 7), "x": torch.randn(5, 3)})
    assert capture.samples == 5 and capture.pass_id == 0
    model(batch={"x": torch.randn(9, 3)})
    assert capture.samples == 9 and capture.pass_id == 1
