"""Feature windows on long contexts: positions, [CLS] labels, offsets, question truncation."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from squad_finetune.data import load_squad_dataset
from squad_finetune.evaluate import normalize_answer
from squad_finetune.features import (
    FeatureSettings,
    answer_token_span,
    build_eval_features,
    build_train_features,
)
from tests.support.squad_data import (
    BERT_VOCAB,
    DEV_SUBSET,
    numbered_words,
    requires_bert_vocab,
    requires_dev_subset,
    word_tokenizer,
)

WORDS = numbered_words(60)
CONTEXT = " ".join(WORDS)  # 60 one-token words
# max_seq 32 with a 1-token question: 32 - 1 - 3 = 28 context tokens per window; 8 shared -> windows start at 0, 20, 40
SETTINGS = FeatureSettings(max_seq_length=32, doc_stride=8, max_query_length=4)
PREFIX = 3  # [CLS] question [SEP] before the first context token


def _examples(answers: list[tuple[str, str]], question: str = "q") -> datasets.Dataset:
    rows = []
    for qid, text in answers:
        start = CONTEXT.index(text)
        rows.append({"id": qid, "title": "t", "context": CONTEXT, "question": question,
                     "answers": {"text": [text], "answer_start": [start]}})
    return datasets.Dataset.from_list(rows)


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return word_tokenizer(WORDS + ["q", "a", "b", "c", "d", "e", "f"])


def test_windows_and_answer_in_second_window(tokenizer) -> None:  # type: ignore[no-untyped-def]
    feats = build_train_features(_examples([("x", "w30 w31")]), tokenizer, SETTINGS)
    assert len(feats) == 3  # windows over tokens 0-27, 20-47, 40-59
    first_ctx = [tokenizer.convert_ids_to_tokens(f["input_ids"])[PREFIX] for f in feats]
    assert first_ctx == ["w0", "w20", "w40"]
    assert all(len(f["input_ids"]) <= SETTINGS.max_seq_length for f in feats)
    labels = [(f["start_positions"], f["end_positions"]) for f in feats]
    assert labels == [(0, 0), (PREFIX + 10, PREFIX + 11), (0, 0)]


def test_answer_across_window_boundary_is_cls_there(tokenizer) -> None:  # type: ignore[no-untyped-def]
    feats = build_train_features(_examples([("x", "w26 w27 w28")]), tokenizer, SETTINGS)
    labels = [(f["start_positions"], f["end_positions"]) for f in feats]
    # window 1 ends at w27: the answer is cut -> [CLS]; window 2 holds all of it at offsets 6-8
    assert labels == [(0, 0), (PREFIX + 6, PREFIX + 8), (0, 0)]


def test_eval_features_keep_ids_and_context_offsets(tokenizer) -> None:  # type: ignore[no-untyped-def]
    feats = build_eval_features(_examples([("x", "w1"), ("y", "w2")]), tokenizer, SETTINGS)
    assert feats["example_id"] == ["x"] * 3 + ["y"] * 3
    for f in feats:
        tokens = tokenizer.convert_ids_to_tokens(f["input_ids"])
        types = np.array(f["token_type_ids"])
        for tok, (s, e), tt in zip(tokens, f["offset_mapping"], types):
            if tt == 1 and tok != "[SEP]":
                assert CONTEXT[s:e] == tok
            else:
                assert (s, e) == (-1, -1)


def test_long_question_truncated_to_max_query_length(tokenizer) -> None:  # type: ignore[no-untyped-def]
    feats = build_train_features(_examples([("x", "w30")], question="a b c d e f"), tokenizer, SETTINGS)
    question_part = [t for t, tt in zip(tokenizer.convert_ids_to_tokens(feats[0]["input_ids"]),
                                        feats[0]["token_type_ids"]) if tt == 0]
    assert question_part == ["[CLS]", "a", "b", "c", "d", "[SEP]"]
    # the 6-token prefix leaves 32 - 4 - 3 = 25 context tokens in the first window
    assert sum(feats[0]["token_type_ids"]) == 25 + 1  # context + final [SEP]


def test_answer_token_span_edges() -> None:
    offsets = np.array([[-1, -1], [0, 3], [4, 9], [9, 12], [13, 15], [-1, -1]])
    ctx = np.array([False, True, True, True, True, False])
    assert answer_token_span(offsets, ctx, 4, 12) == (2, 3)  # a word split in two pieces
    assert answer_token_span(offsets, ctx, 5, 8) == (2, 2)  # inside one token
    assert answer_token_span(offsets, ctx, 13, 20) == (0, 0)  # runs past the window
    assert answer_token_span(offsets, np.zeros(6, dtype=bool), 0, 3) == (0, 0)


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_seq_length=0), dict(max_seq_length=64, max_query_length=64), dict(max_seq_length=64, doc_stride=61,
                                                                              max_query_length=0),
     dict(max_seq_length=100, max_query_length=20, doc_stride=77)],
)
def test_bad_settings_named(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=r"max_seq_length|doc_stride|max_query_length"):
        FeatureSettings(**kwargs)


@requires_bert_vocab
@requires_dev_subset
def test_real_vocab_answer_spans_round_trip() -> None:
    """On real contexts the labelled token span maps back, through the offsets, to the gold answer text."""
    from bert_pretrain.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(BERT_VOCAB)
    assert len(tokenizer) == 30522
    ds, _ = load_squad_dataset(DEV_SUBSET, max_articles=2)
    settings = FeatureSettings(max_seq_length=128, doc_stride=32, max_query_length=32)
    train = build_train_features(ds, tokenizer, settings)
    evalf = build_eval_features(ds, tokenizer, settings)
    assert len(train) == len(evalf) > len(ds)  # long contexts give several windows
    by_id = {r["id"]: r for r in ds}
    labelled = exact = 0
    answered: set[str] = set()
    for f, e in zip(train, evalf):
        if f["start_positions"] == 0:
            continue
        labelled += 1
        answered.add(e["example_id"])
        s, _ = e["offset_mapping"][f["start_positions"]]
        _, end = e["offset_mapping"][f["end_positions"]]
        text = by_id[e["example_id"]]["context"][s:end]
        exact += normalize_answer(text) == normalize_answer(by_id[e["example_id"]]["answers"]["text"][0])
    assert len(answered) / len(ds) > 0.99  # (nearly) every answer is whole in at least one window
    assert exact / labelled > 0.97
