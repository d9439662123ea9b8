"""Gradient matrices round-trip: ``[∇W | ∇b]`` read from each supported module and written back, in one batched copy
where the accessor exposes its tensors and through ``set`` (in order) where it does not."""

from __future__ import annotations

import torch
from torch import nn

from kaisa_ds.layers.modules import ParamGradAccessor, helper_for, write_grads


def _modules() -> list[nn.Module]:
    torch.manual_seed(0)
    from transformers.pytorch_utils import Conv1D

    return [nn.Linear(5, 3), nn.Linear(4, 2, bias=False), nn.Conv2d(2, 3, kernel_size=2), nn.Embedding(7, 4),
            nn.Linear(3, 2).to(torch.bfloat16), Conv1D(3, 5)]


def _fill_grads(modules: list[nn.Module]) -> None:
    for m in modules:
        for p in m.parameters():
            p.grad = torch.randn_like(p)


def _matrices(modules: list[nn.Module]) -> list[torch.Tensor]:
    """New (out, in) FP32 matrices, one per module, of the shapes their gradients read as."""
    g = torch.Generator().manual_seed(1)
    mats = []
    for m in modules:
        helper = helper_for(m)
        assert helper is not None
        mat = helper.grad_matrix(ParamGradAccessor())
        assert mat is not None
        mats.append(torch.randn(mat.shape, generator=g))
    return mats


def _written(modules: list[nn.Module], accessor: object) -> list[list[torch.Tensor]]:
    mats = _matrices(modules)
    parts = []
    for m, mat in zip(modules, mats):
        helper = helper_for(m)
        assert helper is not None
        parts += helper.grad_parts(mat)
    write_grads(accessor, parts)  # type: ignore[arg-type]
    reread = []
    for m, mat in zip(modules, mats):
        helper = helper_for(m)
        assert helper is not None
        back = helper.grad_matrix(ParamGradAccessor())
        assert back is not None
        tol = 1e-2 if next(m.parameters()).dtype == torch.bfloat16 else 0.0  # the gradient keeps its own dtype
        assert torch.allclose(back, mat, rtol=tol, atol=tol), m
        reread.append([p.grad.clone() for p in m.parameters()])
    return reread


class _SetOnly:
    """An accessor with only get/set (the documented minimum): every write goes through set, in order."""

    def __init__(self) -> None:
        self.order: list[tuple[int, ...]] = []

    def get(self, param: nn.Parameter) -> torch.Tensor | None:
        return param.grad

    def set(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        self.order.append(tuple(param.shape))
        param.grad = grad.to(param.dtype).clone()


def test_a_written_matrix_reads_back_the_same_for_every_module_kind() -> None:
    modules = _modules()
    _fill_grads(modules)
    batched = _written(modules, ParamGradAccessor())
    modules_again = _modules()
    _fill_grads(modules_again)
    accessor = _SetOnly()
    one_by_one = _written(modules_again, accessor)
    assert all(torch.equal(a, b) for ga, gb in zip(batched, one_by_one) for a, b in zip(ga, gb))
    assert accessor.order == [tuple(p.shape) for m in modules for p in m.parameters()]  # set, in layer order
    assert all(p.grad.dtype == p.dtype for m in modules for p in m.parameters())


def test_parameters_without_a_gradient_tensor_get_one_through_set() -> None:
    modules = _modules()
    _fill_grads(modules)
    mats = _matrices(modules)
    for m in modules:
        m.zero_grad(set_to_none=True)
    parts = [part for m, mat in zip(modules, mats) for part in helper_for(m).grad_parts(mat)]  # type: ignore[union-attr]
    write_grads(ParamGradAccessor(), parts)
    for m, mat in zip(modules, mats):
        back = helper_for(m).grad_matrix(ParamGradAccessor())  # type: ignore[union-attr]
        tol = 1e-2 if next(m.parameters()).dtype == torch.bfloat16 else 0.0
        assert back is not None and torch.allclose(back, mat, rtol=tol, atol=tol)
