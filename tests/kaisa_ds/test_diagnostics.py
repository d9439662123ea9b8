"""Diagnostics a tuner reads (ν, damping, lr, eigenvalue ranges, decomposition age, failures) and the bound on
consecutive decomposition failures."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from kaisa_ds import KFACConfig, KFACPreconditioner
from kaisa_ds.diagnostics import DecompositionFailed
from kaisa_ds.engine.monitor import kfac_events
from kaisa_ds.layers.groups import layer_group
from tests.support.launch import run_distributed
from tests.support.models import TinyMLP, TinyTransformerish
from tests.support.training import EVERY_STEP


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
    precond = KFACPreconditioner(model, max_decomposition_failures=2, **EVERY_STEP)
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
    precond = KFACPreconditioner(model, max_decomposition_failures=1, grad_worker_fraction="mem-opt", **EVERY_STEP)
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


def test_effectiveness_is_measured_at_decompositions_only_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from kaisa_ds.precondition import effectiveness

    calls: list[int] = []
    real = effectiveness.measure

    def counting(*args: Any, **kwargs: Any) -> effectiveness.Figures:
        calls.append(precond.steps)
        return real(*args, **kwargs)

    monkeypatch.setattr(effectiveness, "measure", counting)
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, inv_update_steps=3, eigenvalues="kronecker")  # a damping share to measure
    for seed in range(6):
        _step(model, precond, seed)
    assert calls == [0, 3]  # no host sync for it on the other steps
    snap = precond.diagnostics_snapshot()
    assert set(snap["effectiveness"]) == {"emb", "query", "key", "value", "out"}
    for figures in snap["effectiveness"].values():
        assert 0 < figures["damping_share"] < 1 and -1 <= figures["cosine"] <= 1
    assert snap["damping_mode"] == "relative" and snap["unpreconditioned_layers"] == []
    names = {n for n, _, _ in kfac_events(precond, samples=0)}
    assert {"Train/KFAC/damping_share/out", "Train/KFAC/cosine/query"} <= names


def test_layers_with_empty_factors_are_named(caplog: pytest.LogCaptureFixture) -> None:
    from tests.support.models import TinyWithUnusedHead

    torch.manual_seed(0)
    model = TinyWithUnusedHead()  # the head's forward hook fires, but no gradient reaches its output
    precond = KFACPreconditioner(model)
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        model.zero_grad()
        F.mse_loss(model(torch.randint(0, 11, (4, 5), generator=g)), torch.randn(4, 5, 5, generator=g)).backward()
        precond.step()
    assert precond.diagnostics_snapshot()["unpreconditioned_layers"] == ["head"]
    named = [r.getMessage() for r in caplog.records if "not preconditioned" in r.getMessage()]
    assert len(named) == 1 and named[0].endswith(": head")  # once, not at every decomposition


def test_preconditioning_that_points_away_from_the_gradient_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    from kaisa_ds.damping import Damping
    from kaisa_ds.enums import DampingMode
    from kaisa_ds.precondition.effectiveness import warn

    warned: set[str] = set()
    figures: dict[str, tuple[float, float] | None] = {"l.0.fc": (0.2, -0.3), "l.1.fc": (0.2, 0.5)}
    for _ in range(2):
        warned |= warn(figures, empty=[], damping=Damping(DampingMode.RELATIVE, 1.0), warned=warned)
    away = [r.getMessage() for r in caplog.records if "points away" in r.getMessage()]
    assert len(away) == 1 and "l.0.fc" in away[0] and "l.1.fc" not in away[0]


@pytest.mark.parametrize("method", ["eigen", "inverse"])
def test_damping_share_follows_the_damping_in_both_methods(method: str) -> None:
    shares = {}
    for r in (1e-6, 1e6):
        torch.manual_seed(0)
        model = TinyTransformerish()
        precond = KFACPreconditioner(model, compute_method=method, relative_damping=r)
        _step(model, precond, 0)
        shares[r] = precond.diagnostics_snapshot()["effectiveness"]
    for group in shares[1e6]:
        assert shares[1e6][group]["damping_share"] > 0.99 and shares[1e6][group]["cosine"] > 0.99  # rescaled
        assert shares[1e-6][group]["damping_share"] < 0.5


@pytest.mark.parametrize("method", ["eigen", "inverse"])
def test_damping_share_is_the_gradient_weighted_share_of_the_spectrum_damping_dominates(method: str) -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    precond = KFACPreconditioner(model, compute_method=method, relative_damping=3.0, kl_clip=None,
                                 decomposition_dtype=torch.float64, inv_dtype=torch.float64)
    x = torch.randn(16, 6)
    model(x).pow(2).mean().backward()
    grad = model.fc2.weight.grad.double().clone()  # type: ignore[union-attr]
    precond.step()
    a, g = precond.layers["fc2"].a.value.double(), precond.layers["fc2"].g.value.double()  # type: ignore[union-attr]
    lam_a, q_a = torch.linalg.eigh(a)
    lam_g, q_g = torch.linalg.eigh(g)
    energy = (q_g.T @ grad @ q_a) ** 2  # the gradient along each eigen-direction of A ⊗ G
    if method == "eigen":
        gamma = 3.0 * lam_a.mean() * lam_g.mean()
        part = gamma / (lam_g[:, None] * lam_a[None, :] + gamma)
    else:
        gamma_a, gamma_g = 3.0**0.5 * lam_a.mean(), 3.0**0.5 * lam_g.mean()
        part = gamma_a * gamma_g / ((lam_g[:, None] + gamma_g) * (lam_a[None, :] + gamma_a))
    want = float((energy * part).sum() / energy.sum())
    assert precond.diagnostics_snapshot()["effectiveness"]["fc2"]["damping_share"] == pytest.approx(want, rel=1e-4)


def test_under_adaptive_eigenvalues_the_snapshot_names_them_and_reports_no_damping() -> None:
    """Adaptive eigenvalues apply no damping: a damping figure there would describe nothing the step does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    precond = KFACPreconditioner(model, eigenvalues="adaptive", factor_update_steps=1, inv_update_steps=1)
    for _ in range(3):
        model.zero_grad()
        model(torch.randn(8, 6)).square().mean().backward()
        precond.step()
    snap = precond.diagnostics_snapshot()
    assert snap["eigenvalue_scaling"] == "adaptive" and snap["damping"] is None and snap["damping_mode"] is None
    assert all(f["damping_share"] == 0.0 for f in snap["effectiveness"].values())
