"""Example creation's map() function: compact, fixed-width columns whatever the number of examples."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bert_pretrain.data.examples import (
    COLUMNS,
    IGNORE,
    ExampleSettings,
    Specials,
    batch_examples,
    document_examples,
    rng_for,
)
from tests.support.bert_data import BERT_VOCAB as VOCAB

SETTINGS = ExampleSettings(max_seq_length=16, max_predictions=3, dupe_factor=2, seed=0)
SPECIALS = Specials(pad=0, cls=2, sep=3, mask=4, vocab_size=100)
DOCS = [[[10, 11, 12], [13, 14], [15, 16, 17]], [[20, 21, 22, 23], [24, 25]], [[30, 31], [32, 33, 34]]]


def _call(rows: list[int]) -> dict[str, np.ndarray]:
    return batch_examples({"doc": [r % 3 for r in rows]}, rows, docs=DOCS,
                          pool=[0, 1, 2], documents_per_copy=3, settings=SETTINGS, specials=SPECIALS)


def test_columns_are_numpy_rows_of_the_stored_types_and_widths() -> None:
    cols = _call(list(range(6)))  # both copies of the three documents
    n = len(cols["next_sentence_label"])
    assert n >= 6 and set(cols) == set(COLUMNS)
    for key, (_, dtype) in COLUMNS.items():
        assert cols[key].dtype == np.dtype(dtype)
    assert cols["input_ids"].shape == cols["token_type_ids"].shape == cols["attention_mask"].shape == (n, 16)
    assert cols["masked_lm_positions"].shape == cols["masked_lm_ids"].shape == (n, 3)
    assert (cols["masked_lm_ids"] != IGNORE).any()


def test_the_rows_are_the_examples_of_each_document_copy_in_order() -> None:
    cols = _call([4])  # copy 1 of document 1
    expected = document_examples(DOCS[1], 1, DOCS, [0, 1, 2], SETTINGS, SPECIALS, rng_for(0, 1, 1))
    assert cols["input_ids"].tolist() == [ex["input_ids"] for ex in expected]
    assert cols["next_sentence_label"].tolist() == [ex["next_sentence_label"] for ex in expected]


def test_a_call_without_examples_keeps_the_widths() -> None:
    cols = _call([])
    assert cols["input_ids"].shape == (0, 16) and cols["masked_lm_ids"].shape == (0, 3)
    assert cols["next_sentence_label"].shape == (0,)


def test_specials_are_read_from_the_tokenizer_and_match_the_trained_vocab_rule(tmp_path: Path) -> None:
    """BERT's real vocab puts [PAD] at 0 and [CLS]/[SEP]/[MASK] at 101-103; a vocabulary bert_pretrain trains
    puts its specials first in SPECIAL's order, which the benchmarks' random batches assume."""
    from benchmarks.harness.batches import trained_vocab_specials
    from bert_pretrain.data.tokenizer import SPECIAL, load_tokenizer

    real = Specials.of(load_tokenizer(VOCAB))
    assert (real.pad, real.cls, real.sep, real.mask, real.vocab_size) == (0, 101, 102, 103, 30522)
    trained = tmp_path / "vocab.txt"
    trained.write_text("\n".join([*SPECIAL, *(f"w{i}" for i in range(200))]) + "\n")
    assert Specials.of(load_tokenizer(trained)) == trained_vocab_specials(205)
