"""Which class implements each :class:`~kaisa_ds.enums.ComputeMethod`: the one place a method is registered."""

from __future__ import annotations

from kaisa_ds.decomposition.eigen import EigenMethod
from kaisa_ds.decomposition.inverse import InverseMethod
from kaisa_ds.decomposition.method import DecompositionMethod
from kaisa_ds.enums import ComputeMethod

METHODS: dict[ComputeMethod, DecompositionMethod] = {
    ComputeMethod.EIGEN: EigenMethod(),
    ComputeMethod.INVERSE: InverseMethod(),
}


def method_for(kind: ComputeMethod | str) -> DecompositionMethod:
    """The implementation of a compute method (its enum member or string value)."""
    return METHODS[ComputeMethod(kind)]
