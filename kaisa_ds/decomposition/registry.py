"""Which class implements each :class:`~kaisa_ds.enums.ComputeMethod`: the one place a method is registered.

:func:`method_for` makes a new instance: a method may keep counts of what it did (the refresh's kept / refreshed /
exact factors), and each preconditioner owns its own."""

from __future__ import annotations

from kaisa_ds.decomposition.eigen import EigenMethod
from kaisa_ds.decomposition.inverse import InverseMethod
from kaisa_ds.decomposition.method import DecompositionMethod
from kaisa_ds.decomposition.refresh import RefreshMethod
from kaisa_ds.enums import ComputeMethod

METHODS: dict[ComputeMethod, type[DecompositionMethod]] = {
    ComputeMethod.EIGEN: EigenMethod,
    ComputeMethod.EIGEN_REFRESH: RefreshMethod,
    ComputeMethod.INVERSE: InverseMethod,
}


def method_for(kind: ComputeMethod | str | DecompositionMethod) -> DecompositionMethod:
    """The implementation of a compute method (its enum member or string value): a new instance; an instance is
    returned as it is."""
    if isinstance(kind, DecompositionMethod):
        return kind
    return METHODS[ComputeMethod(kind)]()
