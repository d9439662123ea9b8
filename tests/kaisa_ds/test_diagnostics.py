"""Diagnostics a tuner reads (ν, damping, lr, eigenvalue ranges, decomposition age, failures) and the bound on
consecutive decomposition failures."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kaisa_ds import KFACConfig, KFACPreconditioner
from kaisa_ds.diagnostics import DecompositionFailed, layer_group
from kaisa_ds.engine.monitor import kfac_events
from tests.support.launch import run_distributed
from tests.support.models import TinyMLP, TinyTransformerish


def _step(model: torch.nn.Module, precond: KFACPreconditioner, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    model.zero_grad()
    F.mse_loss(model(torch.randint(0, 11, (4, 5), generator=g)), torch.randn(4, 5, 5, generator=g)).backward()
    precond.step()


def test_layer_groups_drop_the_layer_index() -> None:
    assert layer_group("bert.encoder.layer.11.attention.self.query") == "bert.encoder.layer.*.attention.self.query"
    assert layer_group("0.fc") == "*.fc" and layer_group("fc1") == "fc1"


def test_snapshot_reports_values_in_force_and_eigenvalue_ranges() -> None:
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, damping=lambda s: 0.01 * (s + 1), lr=0.3, kl_clip=1e-9, inv_update_steps=3,
                                 factor_update_steps=3)  # the factors at step 4 are those decomposed at step 3
    for seed in range(5):
        _step(model, precond, seed)
    snap = precond.diagnostics_snapshot()
    assert snap["damping"] == pytest.approx(0.05) and snap["lr"] == 0.3  # the values of the last step (4)
    assert 0 < snap["kl_scale"] < 1  # a tiny kl_clip scales the step down
    assert snap["decomposition_age"] == 5 - 3 and snap["failed_decompositions"] == 0
    want = torch.linalg.eigvalsh(precond.layers["out"].g.value).clamp(min=0)
    assert snap["eigenvalues"]["out.G"]["max"] == pytest.approx(float(want.max()), rel=1e-4)
    assert 0 <= snap["eigenvalues"]["out.G"]["min"] <= snap["eigenvalues"]["out.G"]["max"]
    assert snap["eigenvalues"]["query.A"]  # a shared A factor is reported under its owner
    names = {n for n, _, _ in kfac_events(precond, samples=0)}
    assert {"Train/KFAC/kl_scale", "Train/KFAC/damping", "Train/KFAC/eigenvalue_max/out.G"} <= names


def test_kl_clip_off_reports_no_scale() -> None:
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, kl_clip=None)
    _step(model, precond, 0)
    assert precond.diagnostics_snapshot()["kl_scale"] is None


def _failing_eigh(*args: object, **kwargs: object) -> None:
    raise torch.linalg.LinAlgError("injected failure")


def test_consecutive_failures_stop_with_the_factor_named(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, max_decomposition_failures=2)
    x = torch.randn(4, 6)
    model(x).pow(2).mean().backward()
    precond.step()  # a good first decomposition
    monkeypatch.setattr(torch.linalg, "eigh", _failing_eigh)
    for _ in range(2):  # tolerated: the previous decomposition is kept
        model.zero_grad()
        model(x).pow(2).mean().backward()
        precond.step()
    assert precond.diagnostics_snapshot()["failed_decompositions"] > 0
    model.zero_grad()
    model(x).pow(2).mean().backward()
    with pytest.raises(DecompositionFailed, match=r"fc\d\.[AG] failed 3 times in a row"):
        precond.step()


def _fail_on_rank_one(rank: int, world: int) -> str:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, max_decomposition_failures=1, grad_worker_fraction="mem-opt")
    if rank == 1:
        torch.linalg.eigh = _failing_eigh  # this process only
    try:
        for _ in range(3):
            model.zero_grad()
            model(torch.randn(4, 6)).pow(2).mean().backward()
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
            precond.step()
    except DecompositionFailed as exc:
        return str(exc)
    return "no error"


def test_every_rank_stops_together_when_one_rank_keeps_failing() -> None:
    messages = run_distributed(_fail_on_rank_one, 2)
    assert all("failed 2 times in a row" in m for m in messages), messages
    assert "rank 1" in messages[0] and "rank 1" not in messages[1]  # rank 1 names its own factor


def test_limit_is_validated() -> None:
    with pytest.raises(ValueError, match="max_decomposition_failures"):
        KFACConfig(max_decomposition_failures=0)
