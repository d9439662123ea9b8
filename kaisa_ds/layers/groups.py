"""Layer groups: a layer's name with its index removed, which is how a person reads a model's layers
(``bert.encoder.layer.*.attention.self.query`` for all twelve of them)."""

from __future__ import annotations

import re

_INDEX = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")


def layer_group(name: str) -> str:
    """``bert.encoder.layer.3.output.dense`` → ``bert.encoder.layer.*.output.dense``."""
    return _INDEX.sub("*", name)
