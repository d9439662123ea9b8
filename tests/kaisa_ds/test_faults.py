"""Overflow, failing decompositions and hooks that never fire never crash training or poison factors."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from torch import nn

from kaisa_ds import KFACPreconditioner
from tests.support.launch import run_distributed
from tests.support.models import TinyMLP
from tests.support.training import EVERY_STEP


def _step(model: nn.Module, precond: KFACPreconditioner, x: torch.Tensor) -> None:
    model.zero_grad()
    model(x).pow(2).mean().backward()
    precond.step()


def test_overflow_drops_window_and_leaves_gradients(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, factor_decay=0.5)
    _step(model, precond, torch.randn(4, 6))
    before = {n: f.value.clone() for n, f in precond.factors().items()}
    bad = torch.randn(4, 6)
    bad[0, 0] = float("inf")
    model.zero_grad()
    model(bad).pow(2).mean().backward()
    raw = {n: p.grad.clone() for n, p in model.named_parameters()}
    with caplog.at_level(logging.WARNING):
        precond.step()
    assert precond.skipped_windows == 1 and "non-finite" in caplog.text
    for n, p in model.named_parameters():
        assert torch.equal(p.grad.nan_to_num(), raw[n].nan_to_num())  # left alone
    for n, f in precond.factors().items():
        assert torch.equal(f.value, before[n]) and torch.isfinite(f.value).all()
        assert not f.has_window
    _step(model, precond, torch.randn(4, 6))  # training continues
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())



def test_a_gradient_whose_fp32_norm_overflows_is_dropped_not_written_as_inf(caplog: pytest.LogCaptureFixture) -> None:
    """A finite gradient too large for FP32's sums of squares would make the step's own norms (grafting, the clip)
    infinite: the step treats it as an overflow instead of writing inf or NaN into the gradients."""
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, factor_decay=0.5)
    _step(model, precond, torch.randn(4, 6))
    model.zero_grad()
    model(torch.randn(4, 6)).pow(2).mean().backward()
    with torch.no_grad():
        model.fc1.weight.grad.mul_(1e25)  # finite, but its squared norm is past FP32's range
    raw = {n: p.grad.clone() for n, p in model.named_parameters()}
    with caplog.at_level(logging.WARNING):
        precond.step()
    assert precond.skipped_windows == 1 and "overflow" in caplog.text
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, raw[n])  # left alone, finite


def test_the_overflow_check_reads_half_precision_windows_in_fp32() -> None:
    """A reduced FP16 window (a sum over ranks of entries scaled to at most 1) can have a norm past FP16's largest
    value while every entry is finite: that is no overflow."""
    from kaisa_ds.precondition.apply import fp32_norms

    def all_finite(tensors: list[torch.Tensor]) -> bool:
        return bool(torch.isfinite(fp32_norms(tensors)).all())

    finite_half = torch.full((4096,), 2000.0, dtype=torch.float16)  # norm 128,000 > 65,504
    assert all_finite([finite_half, torch.ones(3)])
    assert fp32_norms([finite_half]).item() == pytest.approx(128_000.0)
    for bad in (float("nan"), float("inf")):
        poisoned = finite_half.clone()
        poisoned[7] = bad
        assert not all_finite([torch.ones(3), poisoned])
    assert not all_finite([torch.ones(3), torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)])

def _stats_overflow_on_one_rank(rank: int, world: int) -> tuple[int, bool, bool]:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model)
    if rank == 1:  # poison one statistic on this rank only; gradients stay finite everywhere
        original = precond.layers["fc1"].helper.a_statistic

        def poisoned(inp: torch.Tensor, *select: object) -> tuple[torch.Tensor, int]:
            s, n = original(inp, *select)  # type: ignore[arg-type]
            return s * float("nan"), n

        precond.layers["fc1"].helper.a_statistic = poisoned  # type: ignore[method-assign]
    model(torch.randn(4, 6)).pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    precond.step()
    no_factor = all(f.value is None for f in precond.factors().values())
    return precond.skipped_windows, no_factor, dist.get_world_size() == world


def test_overflow_on_one_rank_is_dropped_on_every_rank() -> None:
    for skipped, no_factor, ok in run_distributed(_stats_overflow_on_one_rank, 2):
        assert ok and skipped == 1 and no_factor


def test_failed_decomposition_retries_in_fp64_then_keeps_previous(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, **EVERY_STEP)
    _step(model, precond, torch.randn(4, 6))
    kept = {n: d.eigvecs.clone() for n, d in precond.decompositions.items() if d.eigvecs is not None}
    real_eigh = torch.linalg.eigh
    calls: list[torch.dtype] = []

    def fp32_fails(t: torch.Tensor, *a: object, **k: object):  # type: ignore[no-untyped-def]
        calls.append(t.dtype)
        if t.dtype == torch.float32:
            raise torch.linalg.LinAlgError("injected failure")
        return real_eigh(t, *a, **k)

    monkeypatch.setattr(torch.linalg, "eigh", fp32_fails)
    with caplog.at_level(logging.WARNING):
        _step(model, precond, torch.randn(4, 6))
    assert torch.float64 in calls and "injected failure" in caplog.text
    assert all(d.eigvecs is None or d.eigvecs.dtype == torch.float32 for d in precond.decompositions.values())

    def always_fails(t: torch.Tensor, *a: object, **k: object):  # type: ignore[no-untyped-def]
        raise torch.linalg.LinAlgError("injected failure")

    monkeypatch.setattr(torch.linalg, "eigh", always_fails)
    snapshot = {n: d.eigvecs.clone() for n, d in precond.decompositions.items() if d.eigvecs is not None}
    _step(model, precond, torch.randn(4, 6))
    assert "keeping the previous decomposition" in caplog.text
    for n, v in snapshot.items():
        assert torch.equal(precond.decompositions[n].eigvecs, v)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert kept  # the first decompositions existed


class WithAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x, x, x)[0])


def test_layers_whose_hooks_never_fire_are_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    model = WithAttention()
    precond = KFACPreconditioner(model)
    assert "attn.out_proj" in precond.layers
    with caplog.at_level(logging.WARNING):
        model(torch.randn(2, 3, 8)).sum().backward()
        precond.step()
    assert "attn.out_proj" in caplog.text and "never fired" in caplog.text
    assert list(precond.layers) == ["head"]
