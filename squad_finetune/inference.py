"""Start/end logits for every evaluation window, computed in contiguous shards across ranks.

Each rank runs its share of the windows; the logits (trimmed to each window's length) are gathered on every rank
and laid out as (windows, longest window) tensors, padded with -inf, next to the windows' offsets (-1 padded),
which is the layout :func:`squad_finetune.postprocess.predict_answers` takes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import torch
from deepspeed import comm as dist
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from squad_finetune.features import MODEL_INPUTS


@dataclass
class WindowLogits:
    """Logits and offsets of all windows, (F, L) and (F, L, 2), in feature order."""

    start: torch.Tensor
    end: torch.Tensor
    offsets: torch.Tensor


def _shard(num: int, rank: int, world_size: int) -> range:
    per = -(-num // world_size)
    return range(min(rank * per, num), min((rank + 1) * per, num))


@torch.no_grad()
def _local_logits(
    model: torch.nn.Module, features: datasets.Dataset, *, collate: Callable[[list[dict[str, Any]]], Any],
    batch_size: int, device: torch.device, show_progress: bool,
) -> list[tuple[np.ndarray, np.ndarray]]:
    model.eval()
    # a generator of its own: a DataLoader draws its base seed from the global one, which would shift every later
    # random draw of training (an evaluation before fine-tuning changed the fine-tuned F1)
    loader = DataLoader(features.select_columns(list(MODEL_INPUTS)), batch_size=batch_size,  # type: ignore[arg-type]
                        collate_fn=collate, generator=torch.Generator())
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for batch in tqdm(loader, desc="Evaluating", unit="batch", disable=not show_progress):
        batch = {k: v.to(device) for k, v in batch.items()}
        result = model(**batch)
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        start = result.start_logits.float().cpu().numpy()
        end = result.end_logits.float().cpu().numpy()
        out.extend((start[i, :n], end[i, :n]) for i, n in enumerate(lengths))
    return out


def window_logits(
    model: torch.nn.Module, features: datasets.Dataset, *, collate: Callable[[list[dict[str, Any]]], Any],
    batch_size: int, device: torch.device, show_progress: bool,
) -> WindowLogits:
    """Logits of every window of ``features`` (an eval-features dataset), the work split over all ranks."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    shard = features.select(_shard(len(features), rank, world))
    local = _local_logits(model, shard, collate=collate, batch_size=batch_size, device=device,
                          show_progress=show_progress)
    if world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, local)
        rows = [row for part in gathered for row in part]
    else:
        rows = local
    offsets_rows = features["offset_mapping"]
    longest = max((len(o) for o in offsets_rows), default=1)
    start = torch.full((len(rows), longest), float("-inf"))
    end = torch.full((len(rows), longest), float("-inf"))
    offsets = torch.full((len(rows), longest, 2), -1, dtype=torch.long)
    for i, ((s, e), off) in enumerate(zip(rows, offsets_rows)):
        start[i, : len(s)] = torch.from_numpy(s)
        end[i, : len(e)] = torch.from_numpy(e)
        offsets[i, : len(off)] = torch.tensor(off, dtype=torch.long)
    return WindowLogits(start=start, end=end, offsets=offsets)
