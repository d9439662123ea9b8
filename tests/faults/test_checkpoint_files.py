"""Defect 6: corrupt or half-written checkpoints are detected from their files, named, and skipped for the
newest intact one; DeepSpeed's ``latest`` (empty, dangling or pointing at a half-written tag) is not trusted."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from bert_pretrain.checkpoints import MARKER, CheckpointError, newest_intact, write_marker

PINS = {"vocab_digest": "v", "inputs": [["corpus.txt", 1, "d"]], "data_digest": "x"}


def _tag(folder: Path, step: int, *, world: int = 2, complete: bool = True) -> Path:
    """A checkpoint folder with the files a save writes (small stand-ins for the real tensors)."""
    tag = folder / f"step{step}"
    tag.mkdir(parents=True)
    torch.save({"module": {"w": torch.randn(64, 64)}, "step": step}, tag / "mp_rank_00_model_states.pt")
    for rank in range(world):
        torch.save({"torch": torch.get_rng_state()}, tag / f"rng_rank{rank:03d}.pt")
    (tag / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    if complete:
        write_marker(tag, step=step, world=world, pins=PINS)
    (folder / "latest").write_text(tag.name)
    return tag


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("damage", "culprit"), [
    (lambda t: _truncate(t / "mp_rank_00_model_states.pt"), "mp_rank_00_model_states.pt"),
    (lambda t: _truncate(t / "rng_rank001.pt"), "rng_rank001.pt"),
    (lambda t: _flip_a_byte(t / "mp_rank_00_model_states.pt"), "mp_rank_00_model_states.pt"),
    (lambda t: (t / "rng_rank000.pt").unlink(), "rng_rank000.pt"),
    (lambda t: (t / MARKER).unlink(), MARKER),  # killed mid-save: DeepSpeed's latest already names it
    (lambda t: (t / MARKER).write_text('{"step": 4, "fil'), MARKER),
], ids=["truncated-model", "truncated-rng", "corrupt-model", "missing-rng", "half-written", "torn-marker"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_intact_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, culprit: str) -> None:
    _tag(tmp_path, 2)
    newest = _tag(tmp_path, 4)
    damage(newest)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING):
        chosen = newest_intact(tmp_path, world=2)
    assert chosen is not None and chosen.folder == tmp_path / "step2" and chosen.step == 2
    assert chosen.pins == PINS
    assert culprit in caplog.text and "step4" in caplog.text


@pytest.mark.parametrize("latest", ["", "step99", "step2"])
def test_latest_is_not_trusted(tmp_path: Path, latest: str) -> None:
    _tag(tmp_path, 2)
    _tag(tmp_path, 4)
    (tmp_path / "latest").write_text(latest)
    chosen = newest_intact(tmp_path, world=2)
    assert chosen is not None and chosen.step == 4


def test_no_intact_checkpoint_is_an_error_naming_each_file(tmp_path: Path) -> None:
    _truncate(_tag(tmp_path, 2) / "rng_rank001.pt")
    _tag(tmp_path, 4, complete=False)
    with pytest.raises(CheckpointError, match=r"no intact checkpoint") as err:
        newest_intact(tmp_path, world=2)
    assert "step2/rng_rank001.pt" in str(err.value) and f"step4/{MARKER} is missing" in str(err.value)


def test_no_checkpoint_at_all_starts_from_step_0(tmp_path: Path) -> None:
    assert newest_intact(tmp_path / "checkpoints", world=2) is None


def _kfac_precond():  # type: ignore[no-untyped-def]
    from kaisa_ds import KFACPreconditioner
    from tests.support.models import TinyTransformerish

    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model)
    model(torch.randint(0, 11, (2, 5))).sum().backward()
    precond.step()
    return precond


def _kfac_state() -> dict:
    return _kfac_precond().state_dict()  # type: ignore[no-any-return]


def test_a_non_finite_kfac_state_falls_back_naming_the_factor(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Files intact (sizes and zip checksums match: the values were bad when saved), the K-FAC state is not.
    (A checkpoint of the previous format: the gathered state inside the model-states file.)"""
    state = _kfac_state()
    _tag(tmp_path, 2)
    newest = tmp_path / "step4"
    newest.mkdir()
    name = next(n for n, f in state["factors"].items() if f["value"] is not None)
    state["factors"][name]["value"].view(-1)[0] = float("nan")
    torch.save({"module": {}, "kaisa_ds_kfac": state}, newest / "mp_rank_00_model_states.pt")
    for rank in range(2):
        torch.save({"torch": torch.get_rng_state()}, newest / f"rng_rank{rank:03d}.pt")
    (newest / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    write_marker(newest, step=4, world=2, pins=PINS)
    with caplog.at_level(logging.WARNING):
        chosen = newest_intact(tmp_path, world=2)
    assert chosen is not None and chosen.step == 2
    assert "mp_rank_00_model_states.pt" in caplog.text and name in caplog.text and "not finite" in caplog.text


def _sharded_tag(folder: Path, step: int, *, before_marker: Callable[[Path], None] | None = None) -> Path:
    """A checkpoint with K-FAC shards as kaisa_ds's engine writes them (one rank: one shard and the index)."""
    from kaisa_ds.checkpoint.shards import save_shards
    from kaisa_ds.engine.checkpoint import SHARDS_KEY

    tag = _tag(folder, step, world=1, complete=False)
    precond = _kfac_precond()
    torch.save({"module": {}, SHARDS_KEY: {"world": 1, "steps": precond.steps, "index": "kfac_meta.json"}},
               tag / "mp_rank_00_model_states.pt")
    save_shards(precond, tag)
    if before_marker is not None:
        before_marker(tag)
    write_marker(tag, step=step, world=1, pins=PINS)
    return tag


def _nan_in_shard(tag: Path) -> None:
    shard = tag / "kfac_rank000_of_001.pt"
    content = torch.load(shard, weights_only=True)
    content["factors"]["query.G"]["value"].view(-1)[0] = float("nan")
    torch.save(content, shard)
    meta = json.loads((tag / "kfac_meta.json").read_text())
    meta["shards"][shard.name] = shard.stat().st_size
    (tag / "kfac_meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(("damage", "before_marker", "culprit"), [
    (lambda t: _truncate(t / "kfac_rank000_of_001.pt"), None, "kfac_rank000_of_001.pt"),
    (lambda t: (t / "kfac_rank000_of_001.pt").unlink(), None, "kfac_rank000_of_001.pt"),
    (None, lambda t: (t / "kfac_meta.json").unlink(), "kfac_meta.json"),  # a save killed before the index
    (None, _nan_in_shard, "kfac_rank000_of_001.pt: K-FAC factor query.G is not finite"),
], ids=["truncated-shard", "missing-shard", "no-index", "non-finite-shard"])
def test_a_damaged_kfac_shard_falls_back_naming_the_shard(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None] | None,
        before_marker: Callable[[Path], None] | None, culprit: str) -> None:
    _sharded_tag(tmp_path, 2)
    newest = _sharded_tag(tmp_path, 4, before_marker=before_marker)
    if damage is not None:
        damage(newest)
    with caplog.at_level(logging.WARNING):
        chosen = newest_intact(tmp_path, world=1)
    assert chosen is not None and chosen.step == 2
    assert f"step4/{culprit}" in caplog.text
