"""Which class implements each :class:`~kaisa_ds.enums.ComputeMethod`: the one place a method is registered.

:func:`method_for` makes a new instance: a method may keep counts of what it did (the refresh's kept / refreshed /
exact factors) and state between steps (the adaptive scaling's second moments), and each preconditioner owns its
own. Eigenbasis methods take the :class:`~kaisa_ds.enums.Eigenvalues` scaling the configuration resolved."""

from __future__ import annotations

from kaisa_ds.decomposition.eigen import EigenMethod
from kaisa_ds.decomposition.inverse import InverseMethod
from kaisa_ds.decomposition.method import DecompositionMethod
from kaisa_ds.decomposition.refresh import RefreshMethod
from kaisa_ds.decomposition.scaling import SCALINGS
from kaisa_ds.enums import ComputeMethod, Eigenvalues

METHODS: dict[ComputeMethod, type[DecompositionMethod]] = {
    ComputeMethod.EIGEN: EigenMethod,
    ComputeMethod.EIGEN_REFRESH: RefreshMethod,
    ComputeMethod.INVERSE: InverseMethod,
}


def method_for(kind: ComputeMethod | str | DecompositionMethod, *,
               eigenvalues: Eigenvalues | str = Eigenvalues.KRONECKER) -> DecompositionMethod:
    """The implementation of a compute method (its enum member or string value): a new instance, an eigenbasis one
    scaling by ``eigenvalues``; an instance is returned as it is. ValueError for the inverse method with adaptive
    eigenvalues (it has no eigenbasis to measure them in)."""
    if isinstance(kind, DecompositionMethod):
        return kind
    cls, scaling = METHODS[ComputeMethod(kind)], Eigenvalues(eigenvalues)
    if issubclass(cls, EigenMethod):
        return cls(scaling=SCALINGS[scaling]())
    if scaling is not Eigenvalues.KRONECKER:
        raise ValueError(f"compute_method={ComputeMethod(kind).value!r} has no eigenbasis: eigenvalues="
                         f"{scaling.value!r} needs 'eigen' or 'eigen-refresh'")
    return cls()
