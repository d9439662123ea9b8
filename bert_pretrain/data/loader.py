"""Streaming the prepared Arrow shards to the ranks: a resumable DistributedSampler and micro-batches.

Each rank reads its own ``1/world`` of every epoch's seeded permutation (``torch.utils.data.DistributedSampler``
with rank and world from ``torch.distributed``). The data position is a pure function of the number of
micro-batches consumed, so a resumed run continues with exactly the batches the killed run would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from bert_pretrain.data.documents import DataError


class ResumableSampler(DistributedSampler):  # type: ignore[type-arg]
    """DistributedSampler that can start part-way into an epoch (``skip`` of this rank's indices)."""

    def __init__(self, dataset: Any, *, seed: int, skip: int = 0, **kwargs: Any) -> None:
        super().__init__(dataset, shuffle=True, seed=seed, drop_last=True, **kwargs)
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.skip:])


def load_split(folder: Path, part: str) -> Any:
    """One split of a prepared phase as a torch-formatted Arrow dataset."""
    from datasets import load_from_disk

    path = folder / part
    if not path.is_dir():
        raise DataError(f"prepared data {path} is missing; delete {folder} and run again to prepare it")
    return load_from_disk(str(path)).with_format("torch")


def check_enough_examples(train_examples: int, *, global_batch: int, world: int, folder: Path) -> None:
    """One optimizer step needs ``global_batch`` examples, at least one micro-batch per rank."""
    if train_examples < global_batch:
        raise DataError(f"--data: the corpus gives {train_examples} training examples (in {folder}) but one "
                        f"optimizer step on {world} rank(s) needs train_batch_size={global_batch}; give more text, "
                        "raise --dupe-factor, or lower train_batch_size in the config")


class MicroBatches:
    """Endless micro-batches for this rank, starting after ``consumed`` micro-batches (across epochs)."""

    def __init__(self, dataset: Any, *, micro_batch: int, seed: int, rank: int, world: int, consumed: int = 0):
        self.dataset, self.micro_batch, self.seed = dataset, micro_batch, seed
        self.rank, self.world = rank, world
        per_epoch = len(dataset) // world // micro_batch
        if per_epoch < 1:
            raise DataError(f"--data: {len(dataset)} training examples cannot fill one micro-batch of {micro_batch} "
                            f"on each of {world} ranks; give more text or lower train_micro_batch_size_per_gpu")
        self.per_epoch = per_epoch
        self.epoch, self.offset = divmod(consumed, per_epoch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            sampler = ResumableSampler(self.dataset, seed=self.seed, num_replicas=self.world, rank=self.rank,
                                       skip=self.offset * self.micro_batch)
            sampler.set_epoch(self.epoch)
            # a private generator: DataLoader otherwise draws a seed from the global RNG (and shifts the dropout
            # masks of a resumed run, whose loader starts at another time)
            loader = DataLoader(self.dataset, batch_size=self.micro_batch, sampler=sampler, drop_last=True,
                                generator=torch.Generator().manual_seed(self.seed))
            for batch in loader:
                self.offset += 1
                if self.offset == self.per_epoch:
                    self.epoch, self.offset = self.epoch + 1, 0
                yield batch
                if self.offset == 0:
                    break


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Long tensors on ``device``, the sequence cut to the longest one in the batch (the rest is padding)."""
    length = int(batch["attention_mask"].sum(1).max())  # host tensors: no device synchronisation
    out = {}
    for key, value in batch.items():
        if key in ("input_ids", "token_type_ids", "attention_mask"):
            value = value[:, :length]
        out[key] = value.to(device=device, dtype=torch.long, non_blocking=True)
    return out
