"""Decompositions on the wire: a decomposition's tensors followed by a validity flag.

A broadcast needs every rank to hand over tensors of the same shapes; a rank that holds no decomposition of a factor
(a failed first decomposition, an empty factor) sends zeros of those shapes with flag 0, and receivers keep what they
had. Used by the step's decomposition broadcast and by the gathered checkpoint export.
"""

from __future__ import annotations

import torch

from kaisa_ds.decomposition.decompose import layout
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import ComputeMethod


def placeholder(dim: int, *, diagonal: bool, method: ComputeMethod, dtype: torch.dtype,
                device: torch.device) -> list[torch.Tensor]:
    """Zeros shaped like the decomposition of a ``dim``-sized factor, plus a validity flag of 0."""
    shapes = layout(dim, diagonal=diagonal, method=method) + [(1,)]
    return [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]


def with_flag(dec: Decomposition | None, dim: int, *, diagonal: bool, method: ComputeMethod, dtype: torch.dtype,
              device: torch.device) -> list[torch.Tensor]:
    """``dec``'s tensors and a validity flag of 1; the :func:`placeholder` when there is no ``dec``."""
    if dec is None:
        return placeholder(dim, diagonal=diagonal, method=method, dtype=dtype, device=device)
    tensors = [t.contiguous() for t in dec.tensors()]  # a collective needs dense tensors, not padded-stack views
    return [*tensors, torch.ones(1, dtype=tensors[0].dtype, device=tensors[0].device)]

