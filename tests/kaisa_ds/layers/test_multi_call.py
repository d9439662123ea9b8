"""A module called k times per forward pass: each call's rows are samples of one pass (the "expand" setting of
Eschenhagen et al., NeurIPS 2023), checked against the factors accumulated by hand from every call."""

from __future__ import annotations

import torch
from torch import nn

from kaisa_ds import KFACPreconditioner
from tests.support.models import TinySharedBlock

PASSES, BATCH, CALLS = 2, 5, 3


def _record(module: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every call's input and output gradient, by hooks of the test's own."""
    inputs: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []

    def hook(_: nn.Module, args: tuple, out: torch.Tensor) -> None:
        inputs.append(args[0].detach())
        out.register_hook(lambda g: grads.append(g.detach()))

    module.register_forward_hook(hook)
    return inputs, grads


def test_every_call_of_a_shared_module_adds_its_rows_to_one_pass() -> None:
    torch.manual_seed(0)
    model = TinySharedBlock(calls=CALLS)
    inputs, grads = _record(model.shared)
    precond = KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=1, kl_clip=None, grafting="none",
                                 damping=0.1)
    batches = [torch.randn(BATCH, 6) for _ in range(PASSES)]
    for x in batches:  # gradient accumulation: the loss of each pass is averaged over the passes
        (model(x).pow(2).mean() / PASSES).backward()
    layer = precond.layers["shared"]
    assert layer.a.passes == PASSES and layer.g.passes == PASSES  # passes, not calls
    assert precond.capture.multi_call == {"shared": CALLS}
    precond.step()

    assert len(inputs) == len(grads) == PASSES * CALLS
    rows = torch.cat([torch.cat([x, torch.ones(x.shape[0], 1)], 1) for x in inputs]).double()
    want_a = rows.t() @ rows / rows.shape[0]
    # each output gradient is of the pass's loss / PASSES, per sample of the batch mean: times BATCH and PASSES
    g_rows = torch.cat([g * BATCH * PASSES for g in grads]).double()
    want_g = g_rows.t() @ g_rows / g_rows.shape[0]
    torch.testing.assert_close(layer.a_factor.double(), want_a, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(layer.g_factor.double(), want_g, rtol=1e-5, atol=1e-7)


def test_a_module_called_once_per_pass_counts_each_pass() -> None:
    torch.manual_seed(0)
    model = TinySharedBlock(calls=1)
    precond = KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=1)
    for _ in range(PASSES):
        model(torch.randn(BATCH, 6)).pow(2).mean().backward()
    assert precond.layers["shared"].g.passes == PASSES
    assert precond.capture.multi_call == {}
