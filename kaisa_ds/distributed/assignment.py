"""KAISA work assignment: the grid of gradient-worker groups and a longest-job-first cost model.

With ``world`` ranks and ``grad_workers = world · fraction``, the ranks form a grid of
``world / grad_workers`` *worker groups* of ``grad_workers`` consecutive ranks, and ``grad_workers``
*receiver groups* (the grid's columns: ranks ``k, k + grad_workers, ...``). Each layer (or group of
layers sharing a factor) is given to one worker group: its members hold the layer's decompositions
and precondition its gradient, then each broadcasts the result to its receiver group. Within the
group every factor is decomposed by one rank, chosen longest-job-first by an ``n³`` compute cost
(``n²`` memory breaks ties). fraction 1 (COMM-OPT) → one worker group, no gradient broadcast;
fraction 1/world (MEM-OPT) → one rank per layer, no decomposition broadcast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kaisa_ds.enums import DistributedStrategy


def resolve_grad_workers(fraction: float | DistributedStrategy, world: int, *, cpu_ranks: bool = False) -> int:
    """Number of gradient workers per layer; ValueError unless ``world · fraction`` divides ``world``.
    ``cpu_ranks``: the ranks compute on CPUs (gloo), where :attr:`DistributedStrategy.AUTO` means MEM-OPT."""
    if fraction == DistributedStrategy.AUTO:
        fraction = DistributedStrategy.MEM_OPT if cpu_ranks else DistributedStrategy.COMM_OPT
    if isinstance(fraction, DistributedStrategy):
        if fraction is DistributedStrategy.COMM_OPT:
            return world
        if fraction is DistributedStrategy.MEM_OPT:
            return 1
        return max(1, world // 2)
    workers = fraction * world
    if fraction < 1.0 / world - 1e-9 or not math.isclose(workers, round(workers), abs_tol=1e-6):
        raise ValueError(
            f"grad_worker_fraction={fraction} is not valid for world size {world}; allowed: k/{world} for "
            f"k dividing {world} (e.g. {', '.join(f'{d}/{world}' for d in range(1, world + 1) if world % d == 0)})"
        )
    n = int(round(workers))
    if world % n:
        raise ValueError(
            f"grad_worker_fraction={fraction} gives {n} gradient workers, which does not divide the world size "
            f"{world}; allowed: k/{world} for k dividing {world}"
        )
    return n


@dataclass(frozen=True)
class WorkUnit:
    """Layers that must share gradient workers (they share a factor), with their factors' sizes."""

    name: str
    factors: tuple[tuple[str, int, bool], ...]  # (factor name, dim, diagonal)

    def cost(self) -> float:
        return sum(factor_cost(d, diag) for _, d, diag in self.factors)


def factor_cost(dim: int, diagonal: bool) -> float:
    return float(dim) if diagonal else float(dim) ** 3


def factor_memory(dim: int, diagonal: bool) -> float:
    return float(dim) if diagonal else float(dim) ** 2


@dataclass
class Assignment:
    """The result: who holds, decomposes and broadcasts what. Identical on every rank."""

    world: int
    grad_workers: int
    unit_group: dict[str, int] = field(default_factory=dict)  # unit -> worker-group index
    inverse_worker: dict[str, int] = field(default_factory=dict)  # factor -> rank

    def worker_group(self, index: int) -> list[int]:
        return list(range(index * self.grad_workers, (index + 1) * self.grad_workers))

    @property
    def worker_groups(self) -> list[list[int]]:
        return [self.worker_group(i) for i in range(self.world // self.grad_workers)]

    @property
    def receiver_groups(self) -> list[list[int]]:
        return [list(range(k, self.world, self.grad_workers)) for k in range(self.grad_workers)]

    def receiver_group_of(self, rank: int) -> int:
        return rank % self.grad_workers

    def is_grad_worker(self, unit: str, rank: int) -> bool:
        return rank in self.worker_group(self.unit_group[unit])

    def grad_source(self, unit: str, rank: int) -> int:
        """The member of the unit's worker group that sends this rank its preconditioned gradient."""
        return self.unit_group[unit] * self.grad_workers + self.receiver_group_of(rank)


def assign_work(units: list[WorkUnit], *, world: int, grad_workers: int) -> Assignment:
    """Longest-job-first greedy: units onto worker groups, then factors onto ranks within the group."""
    result = Assignment(world=world, grad_workers=grad_workers)
    n_groups = world // grad_workers
    group_load = [0.0] * n_groups
    rank_load = [(0.0, 0.0)] * world  # (compute, memory)
    for unit in sorted(units, key=lambda u: (-u.cost(), u.name)):
        g = min(range(n_groups), key=lambda i: (group_load[i], i))
        result.unit_group[unit.name] = g
        group_load[g] += unit.cost()
        members = result.worker_group(g)
        for fname, dim, diag in sorted(unit.factors, key=lambda f: (-factor_cost(f[1], f[2]), f[0])):
            r = min(members, key=lambda m: (rank_load[m], m))
            result.inverse_worker[fname] = r
            c, m = rank_load[r]
            rank_load[r] = (c + factor_cost(dim, diag), m + factor_memory(dim, diag))
    return result
