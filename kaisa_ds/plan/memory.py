"""K-FAC bytes per rank: stored factors, open accumulation window, decompositions and cached denominators.

The same quantities as ``precond.memory_usage()`` (and ``benchmarks.memory``): every rank keeps every
factor and its window; a rank keeps the decompositions of the work units its worker group owns, and the
eigen method's ``1 / (λ_G λ_Aᵀ + damping)`` for each layer it preconditions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.registry import method_for
from kaisa_ds.distributed.assignment import Assignment
from kaisa_ds.enums import ComputeMethod, Eigenvalues
from kaisa_ds.plan.shapes import ModelShapes


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def planned_inv_dtype(config: KFACConfig, *, cpu_ranks: bool) -> torch.dtype:
    """The decompositions' dtype on the planned ranks: ``inv_dtype``, its ``"auto"`` resolved for GPUs or CPU ranks."""
    return config.inv_dtype_on(torch.device("cpu" if cpu_ranks else "cuda"))


def planned_method(config: KFACConfig, *, cpu_ranks: bool) -> ComputeMethod:
    """The decomposition method on the planned ranks: ``compute_method``, its ``"auto"`` resolved for GPUs or CPUs."""
    return config.method_on(torch.device("cpu" if cpu_ranks else "cuda"))


def inv_dtype_label(config: KFACConfig, *, cpu_ranks: bool) -> str:
    """The planned decompositions' dtype as the plan prints it, marked ``auto:`` when the default chose it."""
    dtype = planned_inv_dtype(config, cpu_ranks=cpu_ranks)
    return f"auto: {dtype}" if config.inv_dtype is None else str(dtype)


def factor_dtype(config: KFACConfig) -> torch.dtype:
    """The running averages' storage dtype (FP32 statistics when ``factor_dtype`` is unset)."""
    return config.storage_dtype or torch.float32


HALF = (torch.float16, torch.bfloat16)


def window_bytes(shapes: ModelShapes, config: KFACConfig) -> int:
    """Bytes of the open accumulation windows (one buffer per factor, however many passes fill it).

    FP32 (or FP64) factors keep an FP32 ``n×n`` window (a vector for a diagonal factor); FP16/BF16 factors keep
    their window in the storage dtype, as the packed upper triangle (:class:`kaisa_ds.factors.window.ScaledWindow`).
    """
    half = config.storage_dtype in HALF
    size = element_size(config.storage_dtype) if half else 4  # type: ignore[arg-type]
    return size * sum(f.dim if f.diagonal else (f.dim * (f.dim + 1) // 2 if half else f.numel)
                      for f in shapes.factors.values())


@dataclass(frozen=True)
class RankMemory:
    """Bytes on one rank."""

    factors: int
    window: int
    decompositions: int
    denominators: int

    @property
    def total(self) -> int:
        return self.factors + self.window + self.decompositions + self.denominators


def decomposition_numel(dim: int, diagonal: bool, *, method: ComputeMethod) -> int:
    """Elements of one factor's decomposition (eigenvectors and eigenvalues, or the inverse)."""
    return method_for(method).numel(dim, diagonal=diagonal)


def denominator_numel(shapes: ModelShapes, layers: list[str], *, method: ComputeMethod) -> int:
    """Elements of GroupedPreconditioner's cache for the layers one rank preconditions (the method's, per layer)."""
    impl = method_for(method)
    return sum(impl.denominator_numel(shapes.layers[n].out, shapes.layers[n].inp,
                                      a_diagonal=shapes.factors[shapes.layers[n].a].diagonal) for n in layers)


def memory_per_rank(shapes: ModelShapes, assignment: Assignment, config: KFACConfig, *,
                    cpu_ranks: bool = False) -> list[RankMemory]:
    """Steady-state K-FAC bytes of every rank (GPUs, or CPU ranks), inside a factor window (the window buffers are
    open)."""
    method = config.method
    inv = element_size(planned_inv_dtype(config, cpu_ranks=cpu_ranks))
    den_bytes = 4 if config.scaling is Eigenvalues.ADAPTIVE else inv  # adaptive: FP32 second moments, not a cache
    stored = sum(f.numel for f in shapes.factors.values()) * element_size(factor_dtype(config))
    window = window_bytes(shapes, config)
    unit_layers = shapes.unit_layers()
    unit_factors: dict[str, list[str]] = {u.name: [f for f, _, _ in u.factors] for u in shapes.work}
    out = []
    for rank in range(assignment.world):
        units = [u for u in unit_factors if assignment.is_grad_worker(u, rank)]
        dec = sum(decomposition_numel(shapes.factors[f].dim, shapes.factors[f].diagonal, method=method)
                  for u in units for f in unit_factors[u])
        layers = [n for u in units for n in unit_layers.get(u, [])]
        den = denominator_numel(shapes, layers, method=method)
        out.append(RankMemory(factors=stored, window=window, decompositions=dec * inv, denominators=den * den_bytes))
    return out
