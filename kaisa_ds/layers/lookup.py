"""The token ids an embedding actually looks up, for embeddings whose first input is not them.

A learned position table (OPT's and BART's ``*LearnedPositionalEmbedding``) overrides ``nn.Embedding.forward``: it
is called with an attention mask or the token ids and computes the positions it looks up itself. Its A factor is the
count of each looked-up id, so the capture records the indices of the ``F.embedding`` call on the module's own
weight, with a :class:`~torch.overrides.TorchFunctionMode` active only while that module runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class LookupRecorder(TorchFunctionMode):
    """While active, remembers the indices of the last ``F.embedding`` call on ``weight``."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight
        self.ids: torch.Tensor | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.embedding:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            if weight is self.weight:
                ids = args[0] if args else kwargs.get("input")
                self.ids = ids if isinstance(ids, torch.Tensor) else None
        return func(*args, **kwargs)
