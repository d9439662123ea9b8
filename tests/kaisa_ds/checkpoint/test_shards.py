"""Sharded K-FAC checkpoints (kaisa_ds.checkpoint.shards) on gloo CPU ranks: each rank writes about 1/world of the
state, a resume at the same or another world size continues the uninterrupted losses, decompositions a checkpoint
lacks are recomputed, and incomplete shards are refused naming the file."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from kaisa_ds import KFACPreconditioner
from kaisa_ds.checkpoint.shards import META, check_shards, load_shards, save_shards, shard_name
from tests.support.launch import run_distributed
from tests.support.models import TinyStack
from tests.support.training import train_steps

STEPS, SPLIT, WIDTH = 8, 5, 48


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, WIDTH, generator=g), torch.randn(8, WIDTH, generator=g)) for _ in range(STEPS)]


def _make(fraction: str = "comm-opt") -> tuple[TinyStack, KFACPreconditioner, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyStack(WIDTH)
    precond = KFACPreconditioner(model, factor_update_steps=2, inv_update_steps=3, damping=0.01, lr=0.05,
                                 grad_worker_fraction=fraction)
    return model, precond, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _nbytes(obj: object) -> int:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return len(buf.getvalue())


def _save(rank: int, world: int, folder: str, fraction: str) -> dict:
    model, precond, opt = _make(fraction)
    train_steps(model, precond, opt, _data()[:SPLIT])
    save_shards(precond, Path(folder))
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, Path(folder) / "rest.pt")
    shard = Path(folder) / shard_name(rank, world)
    return {"shard_bytes": shard.stat().st_size, "gathered_bytes": _nbytes(precond.state_dict())}


def _resume(rank: int, world: int, folder: str, fraction: str) -> dict:
    model, precond, opt = _make(fraction)
    rest = torch.load(Path(folder) / "rest.pt", weights_only=True)
    model.load_state_dict(rest["model"])
    opt.load_state_dict(rest["opt"])
    load_shards(precond, Path(folder))
    loaded = {"steps": precond.steps, "decompositions": sorted(precond.decompositions),
              "recompute": precond.needs_decomposition}
    return {**loaded, "losses": train_steps(model, precond, opt, _data()[SPLIT:])}


def _reference(*, recompute_at_split: bool = False) -> list[float]:
    """One process, no checkpoint; optionally with every decomposition recomputed at the resume step."""
    model, precond, opt = _make()
    data = _data()
    first = train_steps(model, precond, opt, data[:SPLIT])
    precond.use_decompositions(precond.decompositions, recompute=recompute_at_split)
    return first + train_steps(model, precond, opt, data[SPLIT:])


def _rewrite(shard: Path, content: dict) -> None:
    """Save a changed shard and record its new size in the index, as a save of these values would have."""
    torch.save(content, shard)
    meta = shard.parent / META
    record = json.loads(meta.read_text())
    record["shards"][shard.name] = shard.stat().st_size
    meta.write_text(json.dumps(record))


@pytest.fixture(scope="module")
def saved_on_two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    folder = tmp_path_factory.mktemp("two") / "ckpt"
    return folder, run_distributed(_save, 2, str(folder), "comm-opt")


def test_each_rank_writes_about_half_of_the_gathered_state(saved_on_two: tuple[Path, list[dict]]) -> None:
    folder, results = saved_on_two
    gathered = results[0]["gathered_bytes"]
    assert sorted(p.name for p in folder.glob("kfac_*")) == sorted([shard_name(0, 2), shard_name(1, 2), META])
    shards = [r["shard_bytes"] for r in results]
    assert max(shards) <= 0.6 * gathered  # the previous format: the whole gathered state, written by one rank
    assert sum(shards) <= 1.05 * gathered  # every factor and decomposition once, not once per rank


@pytest.mark.parametrize("world", [1, 2, pytest.param(4, marks=pytest.mark.slow)])  # 4 ranks: ~13 s
def test_resume_at_any_world_size_continues_the_uninterrupted_losses(saved_on_two: tuple[Path, list[dict]],
                                                                      world: int) -> None:
    folder, _ = saved_on_two
    full = _reference()
    results = run_distributed(_resume, world, str(folder), "comm-opt") if world > 1 else [_resume(0, 1, str(folder),
                                                                                                   "comm-opt")]
    for got in results:
        assert got["steps"] == SPLIT and not got["recompute"]  # every decomposition found, none recomputed
        if world == 2:
            assert got["losses"] == full[SPLIT:]  # bit-identical in fp32 at the same world size
        else:  # another reduction order; the decompositions themselves are the saved ones
            assert got["losses"] == pytest.approx(full[SPLIT:], rel=1e-6)


def test_one_rank_to_two_mem_opt(tmp_path: Path) -> None:
    """Saved by one rank (one shard), resumed on two ranks that each hold only their layers' decompositions."""
    _save(0, 1, str(tmp_path), "comm-opt")
    results = run_distributed(_resume, 2, str(tmp_path), "mem-opt")
    full = _reference()
    assert set(results[0]["decompositions"]).isdisjoint(results[1]["decompositions"])  # MEM-OPT: one holder each
    for got in results:
        assert got["losses"] == pytest.approx(full[SPLIT:], rel=1e-6)


def test_a_comm_opt_checkpoint_resumes_under_the_cpu_default(saved_on_two: tuple[Path, list[dict]]) -> None:
    """Runs saved before grad_worker_fraction became "auto" (COMM-OPT on 2 CPU ranks) resume under MEM-OPT, which
    it now means there: each rank takes its layers' decompositions from whichever shard holds them, none recomputed."""
    folder, _ = saved_on_two
    results = run_distributed(_resume, 2, str(folder), "auto")
    assert set(results[0]["decompositions"]).isdisjoint(results[1]["decompositions"])  # one holder each
    for got in results:
        assert got["steps"] == SPLIT and not got["recompute"]
        assert got["losses"] == pytest.approx(_reference()[SPLIT:], rel=1e-6)


def test_a_decomposition_the_shards_lack_is_recomputed_from_its_factor(tmp_path: Path,
                                                                        saved_on_two: tuple[Path, list[dict]]) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(saved_on_two[0], folder)
    shard = folder / shard_name(1, 2)
    content = torch.load(shard, weights_only=True)
    lost = sorted(content["decompositions"])[0]
    content["decompositions"][lost][0].fill_(float("nan"))  # unusable: dropped with a warning, recomputed
    _rewrite(shard, content)
    got = _resume(0, 1, str(folder), "comm-opt")
    assert got["recompute"] and lost not in got["decompositions"]
    assert got["losses"] == pytest.approx(_reference(recompute_at_split=True)[SPLIT:], rel=1e-6)


@pytest.mark.parametrize(("damage", "culprit"), [
    (lambda f: (f / shard_name(1, 2)).unlink(), shard_name(1, 2)),
    (lambda f: (f / shard_name(0, 2)).write_bytes((f / shard_name(0, 2)).read_bytes()[:1000]), shard_name(0, 2)),
    (lambda f: (f / META).unlink(), META),  # killed after the shards, before the index
], ids=["missing-shard", "truncated-shard", "no-index"])
def test_an_incomplete_checkpoint_is_refused_naming_the_file(tmp_path: Path, saved_on_two: tuple[Path, list[dict]],
                                                             damage: object, culprit: str) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(saved_on_two[0], folder)
    damage(folder)  # type: ignore[operator]
    why = check_shards(folder)
    assert why is not None and str(folder / culprit) in why
    _, precond, _ = _make()
    with pytest.raises(ValueError, match=culprit):
        load_shards(precond, folder)
    assert precond.steps == 0 and precond.structure is None  # unchanged


def test_a_non_finite_factor_is_named_with_its_shard(tmp_path: Path, saved_on_two: tuple[Path, list[dict]]) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(saved_on_two[0], folder)
    shard = folder / shard_name(0, 2)
    content = torch.load(shard, weights_only=True)
    name = sorted(content["factors"])[0]
    content["factors"][name]["value"].view(-1)[0] = float("nan")  # bad when saved: sizes and index agree
    _rewrite(shard, content)
    why = check_shards(folder)
    assert why is not None and str(shard) in why and name in why and "not finite" in why


def test_an_index_from_another_save_is_refused(saved_on_two: tuple[Path, list[dict]]) -> None:
    """The model-states file records the K-FAC step it was saved at; an index of another step is not its own."""
    _, precond, _ = _make()
    with pytest.raises(ValueError, match=f"{META} is from K-FAC step {SPLIT}, the checkpoint from step {SPLIT + 1}"):
        load_shards(precond, saved_on_two[0], steps=SPLIT + 1)
    assert precond.steps == 0
