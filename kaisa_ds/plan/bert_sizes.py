"""BERT sizes and KAISA's BERT skip list: the one home of both.

The planner needs them without importing an application, and ``bert_pretrain`` builds its models from them, so
they live here, below both.
"""

from __future__ import annotations

SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096)}  # hidden, layers, attention heads, intermediate
# KAISA's BERT recipe: no K-FAC on the embeddings, the pooler or the prediction heads.
KAISA_SKIP = ("embeddings", "cls", "pooler")
