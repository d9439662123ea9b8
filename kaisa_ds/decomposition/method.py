"""The interface every decomposition method implements, and the stacks the grouped preconditioner multiplies by.

A method knows what it computes of a factor (:meth:`DecompositionMethod.compute`), what a receiver of its broadcast
allocates (:meth:`~DecompositionMethod.layout`), what the planner predicts of it (its memory, its time from measured
rates, its matmuls per step) and how it is applied to a group of stacked layers (:meth:`~DecompositionMethod.prepare`
once per decomposition, :meth:`~DecompositionMethod.apply` every step). The step, the preconditioner, the planner and
the benchmarks ask the method of the configured :class:`~kaisa_ds.enums.ComputeMethod`
(:func:`kaisa_ds.decomposition.registry.method_for`) and never branch on which one it is: a new method is one file
here, one enum member and one line of the registry.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from kaisa_ds.damping import Damping
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import ComputeMethod


@dataclass
class Stacks:
    """One group's stacked decompositions: layers of one shape, the ``share`` layers of one A factor adjacent.

    ``*_mat``: ``(L, n, n)`` matrices (None for a diagonal factor); ``*_vec``: ``(L, n)`` vectors (eigenvalues, or a
    diagonal factor's inverse; None when the method has none). A side has ``L / share`` entries. Methods add what they
    cache between decompositions (:meth:`DecompositionMethod.prepare`)."""

    layers: list[str]
    share: int
    g_mat: torch.Tensor | None
    g_vec: torch.Tensor | None
    a_mat: torch.Tensor | None
    a_vec: torch.Tensor | None
    dtype: torch.dtype
    pad: int = 0  # zero columns appended to the gradients (and to the A stacks) for aligned matmuls
    scale: torch.Tensor | None = None  # what the method multiplies by between the two sides
    shift: torch.Tensor | None = None  # the damping γ per layer, ``(L, 1, 1)``, where the method applies it
    g_rows: torch.Tensor | None = None  # a diagonal G applied as a row scaling, ``(L, out, 1)``

    def a_side(self, v: torch.Tensor, *, transpose: bool) -> torch.Tensor:
        """``v @ A`` (or ``Aᵀ``) per layer, the layers sharing an A factor stacked into one taller matrix."""
        assert self.a_mat is not None
        a = self.a_mat.transpose(1, 2) if transpose else self.a_mat
        n_layers, rows, cols = v.shape
        return (v.reshape(n_layers // self.share, self.share * rows, cols) @ a).reshape(n_layers, rows, cols)

    def g_side(self, v: torch.Tensor, *, transpose: bool) -> torch.Tensor:
        """``G v`` (or ``Gᵀ v``) per layer: a matmul, a row scaling, or nothing (a diagonal G's eigenvectors)."""
        if self.g_mat is not None:
            return (self.g_mat.transpose(1, 2) if transpose else self.g_mat) @ v
        return v if self.g_rows is None else v * self.g_rows


class Rates(Protocol):
    """Measured rates a method's cost model reads (the planner's :class:`kaisa_ds.plan.overhead.Rates`)."""

    @property
    def gemm_gflops(self) -> float: ...

    @property
    def eigh_seconds(self) -> Mapping[int, float]: ...

    @property
    def inverse_seconds(self) -> Mapping[int, float]: ...


def scaled(table: Mapping[int, float], n: int, *, flag: str) -> float:
    """The time at size ``n`` from a table of measured sizes: the nearest one, times ``(n / m)³``."""
    if not table:
        raise ValueError(f"no timing for this decomposition method: give {flag} SIZE=SECONDS or --calibration")
    m = min(table, key=lambda size: abs(math.log(size / n)))
    return table[m] * (n / m) ** 3


class DecompositionMethod(ABC):
    """One way of turning a factor into what preconditioning multiplies by."""

    kind: ClassVar[ComputeMethod]
    rate_flag: ClassVar[str]  # the planner's flag of the timings its cost model reads
    matmuls_per_step: ClassVar[int]  # batched matmuls per layer group and preconditioned step
    damped_at_decomposition: ClassVar[bool]  # the damping is in the decomposition (a change needs a new one)
    matrix: ClassVar[str]  # the Decomposition field stacked as ``*_mat`` (its 2-D tensors)
    vector: ClassVar[str]  # the Decomposition field stacked as ``*_vec`` (its 1-D tensors)

    @abstractmethod
    def compute(self, factors: torch.Tensor, *, diagonal: bool, damping: Damping, dtype: torch.dtype,
                previous: Decomposition | None = None) -> Decomposition:
        """Decompose one factor or a batch ``(L, n, n)`` of equal-size ones in ``dtype`` (``previous``: the
        decompositions in force, batched alike, for a method that starts from them). May raise, or return
        non-finite values: the caller retries in FP64 and keeps the previous decomposition if that fails too."""

    @abstractmethod
    def layout(self, dim: int, *, diagonal: bool) -> list[tuple[int, ...]]:
        """Shapes of :meth:`Decomposition.tensors` for a factor of size ``dim`` (what a receiver allocates)."""

    @abstractmethod
    def from_tensors(self, tensors: list[torch.Tensor]) -> Decomposition:
        """The inverse of :meth:`Decomposition.tensors`."""

    def numel(self, dim: int, *, diagonal: bool) -> int:
        """Elements of one factor's decomposition."""
        return sum(math.prod(shape) for shape in self.layout(dim, diagonal=diagonal))

    @abstractmethod
    def seconds(self, n: int, *, rates: Rates) -> float:
        """Predicted time to decompose one dense factor of size ``n`` (the planner's cost model)."""

    @abstractmethod
    def denominator_numel(self, out: int, inp: int, *, a_diagonal: bool) -> int:
        """Elements of the per-layer cache :meth:`prepare` keeps for a layer of ``(out, inp)`` (0: per group)."""

    def start_round(self) -> None:
        """A decomposition round begins (:func:`~kaisa_ds.decomposition.decompose.decompose_all`): :meth:`report`
        describes the calls from here on."""
        return None  # nothing to reset for a method that keeps no counts

    def report(self) -> dict[str, float]:
        """What the method did in its last decomposition round, for the diagnostics (nothing by default)."""
        return {}

    def export_state(self) -> dict[str, dict[str, Any]]:
        """Per layer, what the method keeps between steps besides the decompositions (a checkpoint saves it)."""
        return {}

    def load_state(self, saved: dict[str, dict[str, Any]]) -> None:
        """Replace that state with a saved one (:meth:`export_state`'s format); nothing to load by default."""
        return None

    def state_nbytes(self) -> int:
        """Bytes of that state."""
        return 0

    @abstractmethod
    def prepare(self, stacks: Stacks, damping: Damping) -> None:
        """Fill what :meth:`apply` multiplies by from the stacked decompositions (once per decomposition, and for
        a method damped at preconditioning, once per damping value)."""

    @abstractmethod
    def apply(self, stacks: Stacks, v: torch.Tensor) -> torch.Tensor:
        """The preconditioned ``(L, out, in)`` gradients of the group (``v`` in ``stacks.dtype``)."""
