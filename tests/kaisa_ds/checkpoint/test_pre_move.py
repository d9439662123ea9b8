"""Checkpoints written before the architecture move (commit a98885d, by pre_move/generate.py) load with today's
code, through the shard folder and through state_dict, and training continues with the losses the old code had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kaisa_ds.checkpoint.shards import load_shards
from tests.kaisa_ds.checkpoint.pre_move.generate import SAVE_AT, SETTINGS, batches, make, step

PRE_MOVE = Path(__file__).parent / "pre_move"


@pytest.mark.parametrize("method", list(SETTINGS))
@pytest.mark.parametrize("route", ["shards", "state_dict"])
def test_a_pre_move_checkpoint_resumes_exactly(method: str, route: str) -> None:
    folder = PRE_MOVE / method
    model, precond, opt = make(method)
    rest = torch.load(folder / "rest.pt", weights_only=True)
    model.load_state_dict(rest["model"])
    opt.load_state_dict(rest["opt"])
    if route == "shards":
        load_shards(precond, folder / "shards")
    else:
        precond.load_state_dict(torch.load(folder / "state_dict.pt", weights_only=True))
    assert precond.steps == SAVE_AT
    losses = [step(model, precond, opt, batch) for batch in batches()[SAVE_AT:]]
    expected = json.loads((PRE_MOVE / "expected_losses.json").read_text())[method]
    assert losses == pytest.approx(expected, rel=1e-6, abs=0)
