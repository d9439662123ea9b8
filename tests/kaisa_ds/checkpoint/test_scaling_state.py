"""The adaptive eigenvalues' second moments in checkpoints (kaisa_ds.checkpoint.scaling_state): a resume through
state_dict or sharded files, at the same or another world size, continues the uninterrupted losses; a state without
them (saved under K-FAC's own eigenvalues) starts them from zero and says so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from kaisa_ds import KFACPreconditioner
from kaisa_ds.checkpoint.scaling_state import KEY
from kaisa_ds.checkpoint.shards import load_shards, save_shards
from tests.support.launch import run_distributed
from tests.support.models import TinyStack
from tests.support.training import train_steps

STEPS, SPLIT, WIDTH = 14, 5, 24


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, WIDTH, generator=g), torch.randn(8, WIDTH, generator=g)) for _ in range(STEPS)]


def _make(fraction: str = "comm-opt", eigenvalues: str = "adaptive"
          ) -> tuple[TinyStack, KFACPreconditioner, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyStack(WIDTH)
    precond = KFACPreconditioner(model, factor_update_steps=2, inv_update_steps=3, eigenvalues=eigenvalues,
                                 grad_worker_fraction=fraction)
    return model, precond, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _reference() -> list[float]:
    return train_steps(*_make(), _data())


def test_a_state_dict_resume_continues_bit_identically_and_keeps_every_layers_moments() -> None:
    full = _reference()
    model, precond, opt = _make()
    train_steps(model, precond, opt, _data()[:SPLIT])
    saved = {"model": model.state_dict(), "opt": opt.state_dict(), "kfac": precond.state_dict()}
    assert sorted(saved["kfac"][KEY]) == [f"layers.{i}" for i in range(4)]
    assert all(e["count"] == SPLIT for e in saved["kfac"][KEY].values())
    model2, precond2, opt2 = _make()
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    precond2.load_state_dict(saved["kfac"])
    assert train_steps(model2, precond2, opt2, _data()[SPLIT:]) == full[SPLIT:]


def test_without_the_moments_a_resume_starts_them_from_zero_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    model, precond, opt = _make()
    train_steps(model, precond, opt, _data()[:SPLIT])
    state = precond.state_dict()
    state.pop(KEY)  # a state saved under eigenvalues="kronecker", or before the moments were kept
    _, precond2, _ = _make()
    with caplog.at_level(logging.WARNING, logger="kaisa_ds.checkpoint.scaling_state"):
        precond2.load_state_dict(state)
    assert "start from zero" in caplog.text and precond2.grouped.method.export_state() == {}


def _save(rank: int, world: int, folder: str, fraction: str) -> list[float]:
    """Train, save, then go on uninterrupted: the losses a resume must continue."""
    model, precond, opt = _make(fraction)
    train_steps(model, precond, opt, _data()[:SPLIT])
    save_shards(precond, Path(folder))
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, Path(folder) / "rest.pt")
    return train_steps(model, precond, opt, _data()[SPLIT:])


def _resume(rank: int, world: int, folder: str, fraction: str, forget: bool = False) -> dict:
    model, precond, opt = _make(fraction)
    rest = torch.load(Path(folder) / "rest.pt", weights_only=True)
    model.load_state_dict(rest["model"])
    opt.load_state_dict(rest["opt"])
    load_shards(precond, Path(folder))
    moments = sorted(precond.grouped.method.export_state())
    if forget:  # the contrast: the same resume with the moments started from zero
        precond.grouped.method.load_state({})
    return {"moments": moments, "losses": train_steps(model, precond, opt, _data()[SPLIT:])}


@pytest.mark.parametrize(("saved_by", "resumed_by"), [(1, 2), (2, 1)])
def test_sharded_moments_resume_at_another_world_size(tmp_path: Path, saved_by: int, resumed_by: int) -> None:
    """Two MEM-OPT ranks each hold (and write) the moments of their own layers; the other world size reads each
    layer's from whichever shard has it and continues the saving run (to rounding: another reduction order), far
    closer than the same resume with the moments started from zero."""
    if saved_by == 1:
        uninterrupted = _save(0, 1, str(tmp_path), "mem-opt")
    else:
        uninterrupted = run_distributed(_save, 2, str(tmp_path), "mem-opt")[0]

    def resume(forget: bool) -> list[dict]:
        return (run_distributed(_resume, 2, str(tmp_path), "mem-opt", forget) if resumed_by == 2
                else [_resume(0, 1, str(tmp_path), "mem-opt", forget)])

    results, forgotten = resume(False), resume(True)
    held = [set(r["moments"]) for r in results]
    assert set().union(*held) == {f"layers.{i}" for i in range(4)}
    if resumed_by == 2:
        assert held[0].isdisjoint(held[1])  # MEM-OPT: each layer preconditioned (and its moments kept) once
    off = max(abs(a - b) for a, b in zip(forgotten[0]["losses"], uninterrupted))
    near = max(abs(a - b) for r in results for a, b in zip(r["losses"], uninterrupted))
    assert near < off / 100  # seen: ~1e-7 against ~1e-3
