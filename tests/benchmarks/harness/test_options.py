"""The names benchmarks print map onto kaisa_ds's own values: strategy names onto DistributedStrategy (and back
through the planner's naming), dtype names onto kaisa_ds.config's."""

from __future__ import annotations

import pytest
import torch

from benchmarks.harness.options import DTYPE_NAMES, STRATEGIES, autocast_dtype
from kaisa_ds.config import KFACConfig
from kaisa_ds.distributed.assignment import resolve_grad_workers
from kaisa_ds.plan.summary import strategy_name


@pytest.mark.parametrize("world", [4, 8])
def test_strategy_names_are_what_the_planner_calls_their_grids(world: int) -> None:
    for name, strategy in STRATEGIES.items():
        assert strategy_name(world, resolve_grad_workers(strategy, world)) == name


def test_dtype_names_are_kaisa_ds_dtypes_and_fp32_means_no_autocast() -> None:
    for name in DTYPE_NAMES:
        config = KFACConfig(factor_dtype=name, inv_dtype=name)
        assert config.inv_dtype == config.factor_dtype
        assert autocast_dtype(name) == (None if config.inv_dtype == torch.float32 else config.inv_dtype)
