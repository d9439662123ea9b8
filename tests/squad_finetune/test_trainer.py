"""The training plan says when a requested step count cannot be reached."""

from __future__ import annotations

import logging

import pytest

from squad_finetune.settings import Recipe
from squad_finetune.trainer import TrainPlan


def test_max_steps_beyond_the_epochs_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    # 64 windows, 8 per step on 2 ranks of 4: 8 steps an epoch, 16 in 2 epochs; 100 asked for
    with caplog.at_level(logging.WARNING, logger="squad_finetune.trainer"):
        plan = TrainPlan.make(64, micro_batch=4, accumulation=1, world_size=2, recipe=Recipe(epochs=2, max_steps=100))
    assert plan.total_steps == 16
    message = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "--max-steps 100" in message and "16" in message and "--epochs" in message, message


def test_max_steps_within_the_epochs_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="squad_finetune.trainer"):
        plan = TrainPlan.make(64, micro_batch=4, accumulation=1, world_size=2, recipe=Recipe(epochs=2, max_steps=10))
    assert plan.total_steps == 10 and not caplog.records
