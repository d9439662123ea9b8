"""The KAISA grid and the longest-job-first assignment."""

from __future__ import annotations

import pytest

from kaisa_ds.distributed.assignment import WorkUnit, assign_work, factor_cost


def _units() -> list[WorkUnit]:
    sizes = [(1025, 1024), (1025, 4096), (4097, 1024), (257, 256), (31, 64)]
    return [WorkUnit(f"l{i}", ((f"l{i}.A", a, False), (f"l{i}.G", g, False))) for i, (a, g) in enumerate(sizes)]


@pytest.mark.parametrize(("world", "workers"), [(4, 4), (4, 2), (4, 1), (8, 2), (1, 1)])
def test_grid_groups_partition_the_world(world: int, workers: int) -> None:
    a = assign_work(_units(), world=world, grad_workers=workers)
    flat = sorted(r for g in a.worker_groups for r in g)
    assert flat == list(range(world))
    assert sorted(r for g in a.receiver_groups for r in g) == list(range(world))
    for wg in a.worker_groups:  # every receiver group holds exactly one member of every worker group
        for rg in a.receiver_groups:
            assert len(set(wg) & set(rg)) == 1
    for unit in _units():
        group = a.worker_group(a.unit_group[unit.name])
        assert all(a.inverse_worker[f] in group for f, _, _ in unit.factors)
        for rank in range(world):
            src = a.grad_source(unit.name, rank)
            assert src in group and src % workers == rank % workers


def test_comm_opt_spreads_factors_and_mem_opt_keeps_a_layer_on_one_rank() -> None:
    comm = assign_work(_units(), world=4, grad_workers=4)
    assert len(set(comm.inverse_worker.values())) == 4
    mem = assign_work(_units(), world=4, grad_workers=1)
    for unit in _units():
        assert len({mem.inverse_worker[f] for f, _, _ in unit.factors}) == 1


def test_longest_job_first_balances_compute() -> None:
    units = [WorkUnit(f"u{i}", ((f"u{i}.A", d, False),)) for i, d in enumerate([100, 90, 80, 70, 60, 50, 40, 30])]
    a = assign_work(units, world=2, grad_workers=2)
    load = [0.0, 0.0]
    for u in units:
        load[a.inverse_worker[u.factors[0][0]]] += factor_cost(u.factors[0][1], False)
    assert max(load) / sum(load) < 0.6  # a round-robin of this list would put 100³+80³+60³+40³ (≈0.61) on one rank
    assert a.inverse_worker["u0.A"] != a.inverse_worker["u1.A"]


def test_diagonal_factors_cost_linear() -> None:
    assert factor_cost(30522, True) == 30522.0
    assert factor_cost(10, False) == 1000.0
