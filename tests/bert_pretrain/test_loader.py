"""Streaming to ranks: disjoint per-rank shards, resuming at a data position, batch trimming, size checks."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest
import torch

from bert_pretrain.data.documents import DataError
from bert_pretrain.data.loader import MicroBatches, check_enough_examples, to_device


@pytest.fixture(scope="module")
def dataset():  # type: ignore[no-untyped-def]
    from datasets import Dataset

    n = 50
    lengths = [3 + i % 5 for i in range(n)]
    return Dataset.from_dict({
        "input_ids": [[i] * k + [0] * (10 - k) for i, k in enumerate(lengths)],
        "token_type_ids": [[0] * 10 for _ in range(n)],
        "attention_mask": [[1] * k + [0] * (10 - k) for k in lengths],
        "masked_lm_positions": [[1, 2] for _ in range(n)], "masked_lm_ids": [[i, -100] for i in range(n)],
        "next_sentence_label": [i % 2 for i in range(n)]}).with_format("torch")


def _ids(batches: list[dict[str, torch.Tensor]]) -> list[list[int]]:
    return [b["masked_lm_ids"][:, 0].tolist() for b in batches]


def test_ranks_read_disjoint_shards_and_epochs_reshuffle(dataset) -> None:  # type: ignore[no-untyped-def]
    per_rank = [_ids(list(islice(iter(MicroBatches(dataset, micro_batch=4, seed=1, rank=r, world=2)), 12)))
                for r in range(2)]
    epoch0 = [[i for b in per_rank[r][:6] for i in b] for r in range(2)]  # 50 // 2 // 4 = 6 batches an epoch
    assert not set(epoch0[0]) & set(epoch0[1]) and len(set(epoch0[0])) == 24
    assert [i for b in per_rank[0][6:] for i in b] != epoch0[0]  # the next epoch is another permutation


def test_resuming_at_a_position_gives_the_same_batches(dataset) -> None:  # type: ignore[no-untyped-def]
    whole = _ids(list(islice(iter(MicroBatches(dataset, micro_batch=4, seed=3, rank=1, world=2)), 15)))
    for consumed in (0, 4, 6, 11):
        resumed = islice(iter(MicroBatches(dataset, micro_batch=4, seed=3, rank=1, world=2, consumed=consumed)),
                         15 - consumed)
        assert _ids(list(resumed)) == whole[consumed:]


def test_batches_are_cut_to_their_longest_sequence(dataset) -> None:  # type: ignore[no-untyped-def]
    batch = to_device(dataset[[0, 1, 2]], torch.device("cpu"))  # lengths 3, 4, 5
    assert batch["input_ids"].shape == (3, 5) and batch["input_ids"].dtype == torch.long
    assert batch["masked_lm_ids"].shape == (3, 2) and batch["next_sentence_label"].dtype == torch.long


def test_too_little_data_is_refused(dataset) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError, match="cannot fill one micro-batch of 32 on each of 2 ranks"):
        MicroBatches(dataset, micro_batch=32, seed=0, rank=0, world=2)
    check_enough_examples(64, global_batch=64, world=2, folder=Path("d"))
    with pytest.raises(DataError, match=r"gives 63 training examples .* needs train_batch_size=64"):
        check_enough_examples(63, global_batch=64, world=2, folder=Path("d"))


def test_reading_batches_leaves_the_global_rng_alone(dataset) -> None:  # type: ignore[no-untyped-def]
    """Dropout masks come from the global RNG; a resumed run starts its loader at another moment, so the loader
    must not draw from it."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    list(islice(iter(MicroBatches(dataset, micro_batch=4, seed=0, rank=0, world=1, consumed=10)), 8))
    assert torch.equal(torch.get_rng_state(), before)
