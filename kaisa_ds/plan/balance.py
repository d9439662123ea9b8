"""Decomposition work per rank under the real longest-job-first assignment, and how far from balanced it is.

Work is the assignment's own cost model (:func:`~kaisa_ds.distributed.assignment.factor_cost`: n³ for a dense
factor, n for a diagonal one). The imbalance is max/mean over ranks; its bound is the best any assignment
of whole factors could do, ``max(largest single decomposition, total / world) / mean``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kaisa_ds.distributed.assignment import Assignment, assign_work, factor_cost
from kaisa_ds.plan.shapes import ModelShapes


@dataclass(frozen=True)
class Balance:
    per_rank: list[float]  # decomposition cost (n³ units) of every rank
    largest: float  # the most expensive single decomposition

    @property
    def mean(self) -> float:
        return sum(self.per_rank) / len(self.per_rank)

    @property
    def imbalance(self) -> float:
        """max/mean decomposition cost per rank (1 = perfectly balanced)."""
        return max(self.per_rank) / self.mean if self.mean else 1.0

    @property
    def bound(self) -> float:
        """The lowest max/mean any assignment of whole factors can reach."""
        return max(self.largest, self.mean) / self.mean if self.mean else 1.0


def assign(shapes: ModelShapes, *, world: int, grad_workers: int) -> Assignment:
    """The assignment a run of this model would make (the very function the preconditioner calls)."""
    return assign_work(shapes.work, world=world, grad_workers=grad_workers)


def balance(shapes: ModelShapes, assignment: Assignment) -> Balance:
    per_rank = [0.0] * assignment.world
    for name, rank in assignment.inverse_worker.items():
        f = shapes.factors[name]
        per_rank[rank] += factor_cost(f.dim, f.diagonal)
    largest = max((factor_cost(f.dim, f.diagonal) for f in shapes.factors.values()), default=0.0)
    return Balance(per_rank=per_rank, largest=largest)
