"""Questions + contexts -> model windows: the BERT SQuAD recipe on a fast tokenizer's offsets.

A context longer than the window is cut into overlapping windows (``return_overflowing_tokens``); consecutive
windows share ``doc_stride`` context tokens (the tokenizer's ``stride``, as in Hugging Face's ``run_qa.py``).
Questions are cut to ``max_query_length`` tokens first. Training windows carry the answer's token span, or [CLS]
(index 0) when the answer is not entirely inside the window; evaluation windows keep their question id and the
character offsets of their context tokens (``(-1, -1)`` elsewhere) so spans can be mapped back to text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from kaisa_ds.enums import parse_count

NO_OFFSET = (-1, -1)
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


@dataclass(frozen=True)
class FeatureSettings:
    """Window geometry, in tokens (defaults: the BERT paper's SQuAD settings)."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64

    def __post_init__(self) -> None:
        parse_count("max_seq_length", self.max_seq_length, meaning="tokens in a window")
        parse_count("doc_stride", self.doc_stride, meaning="context tokens consecutive windows share")
        parse_count("max_query_length", self.max_query_length, meaning="question tokens kept")
        room = self.max_seq_length - self.max_query_length - 3  # [CLS] question [SEP] context [SEP]
        if room < 1:
            raise ValueError(f"max_seq_length={self.max_seq_length} leaves no room for context after a question of "
                             f"max_query_length={self.max_query_length} tokens and 3 special tokens; raise "
                             "max_seq_length or lower max_query_length")
        if self.doc_stride >= room:
            raise ValueError(f"doc_stride={self.doc_stride} must be smaller than the context room of a window "
                             f"({room} = max_seq_length - max_query_length - 3); lower doc_stride")


def truncate_questions(questions: list[str], tokenizer: PreTrainedTokenizerBase, max_query_length: int) -> list[str]:
    """Questions cut (at a token's end) to at most ``max_query_length`` tokens, leading whitespace removed."""
    questions = [q.lstrip() for q in questions]
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    return [
        q if len(offsets) <= max_query_length else q[: offsets[max_query_length - 1][1]]
        for q, offsets in zip(questions, enc["offset_mapping"])
    ]


def answer_token_span(offsets: np.ndarray, is_context: np.ndarray, start_char: int, end_char: int) -> tuple[int, int]:
    """Token positions of the answer characters ``[start_char, end_char)`` in one window, or (0, 0) ([CLS]).

    ``offsets`` is (L, 2) character offsets, ``is_context`` (L,) marks context tokens. The answer must lie entirely
    inside the window's context; a span cut by the window edge is labelled [CLS], as in BERT.
    """
    idx = np.flatnonzero(is_context)
    if idx.size == 0 or offsets[idx[0], 0] > start_char or offsets[idx[-1], 1] < end_char:
        return 0, 0
    start = idx[np.searchsorted(offsets[idx, 0], start_char, side="right") - 1]  # last token starting at/before
    end = idx[np.searchsorted(offsets[idx, 1], end_char, side="left")]  # first token ending at/after
    return int(start), int(end)


def _encode(examples: dict[str, list[Any]], tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings) -> Any:
    questions = truncate_questions(examples["question"], tokenizer, settings.max_query_length)
    return tokenizer(
        questions, examples["context"], truncation="only_second", max_length=settings.max_seq_length,
        stride=settings.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
        return_token_type_ids=True, padding=False,
    )


def _context_mask(enc: Any, i: int) -> np.ndarray:
    return np.array([sid == 1 for sid in enc.sequence_ids(i)], dtype=bool)


def train_features(
    examples: dict[str, list[Any]], *, tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings
) -> dict[str, list[Any]]:
    """Batched ``datasets.map`` function: windows with ``start_positions``/``end_positions`` (first gold answer)."""
    enc = _encode(examples, tokenizer, settings)
    sample_of = enc["overflow_to_sample_mapping"]
    starts: list[int] = []
    ends: list[int] = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        answers = examples["answers"][sample_of[i]]
        start_char = answers["answer_start"][0]
        span = answer_token_span(np.asarray(offsets), _context_mask(enc, i), start_char,
                                 start_char + len(answers["text"][0]))
        starts.append(span[0])
        ends.append(span[1])
    out = {k: enc[k] for k in MODEL_INPUTS}
    return {**out, "start_positions": starts, "end_positions": ends}


def eval_features(
    examples: dict[str, list[Any]], *, tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings
) -> dict[str, list[Any]]:
    """Batched ``datasets.map`` function: windows with ``example_id`` and context-only ``offset_mapping``."""
    enc = _encode(examples, tokenizer, settings)
    sample_of = enc["overflow_to_sample_mapping"]
    offsets_out = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        mask = _context_mask(enc, i)
        offsets_out.append([tuple(o) if m else NO_OFFSET for o, m in zip(offsets, mask)])
    out = {k: enc[k] for k in MODEL_INPUTS}
    return {**out, "example_id": [examples["id"][s] for s in sample_of], "offset_mapping": offsets_out}


def _check_tokenizer(tokenizer: PreTrainedTokenizerBase) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer; SQuAD windows need character offsets "
                         "(save the model directory with a tokenizer.json, or load a *TokenizerFast)")


def _fingerprint(
    kind: str, dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings
) -> str:
    """A cheap identity for ``map`` (the default hashes the whole tokenizer object)."""
    key = f"{kind}|{dataset._fingerprint}|{tokenizer.name_or_path}|{len(tokenizer)}|{settings}"
    return hashlib.sha1(key.encode()).hexdigest()


def _map_windows(dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings, *,
                 kind: str, desc: str, make: Callable[..., dict[str, list[Any]]]) -> datasets.Dataset:
    """``dataset.map`` of one window builder, cached under a fingerprint of the data, tokenizer and settings."""
    _check_tokenizer(tokenizer)
    fn = partial(make, tokenizer=tokenizer, settings=settings)
    return dataset.map(fn, batched=True, remove_columns=dataset.column_names, desc=desc,
                       new_fingerprint=_fingerprint(kind, dataset, tokenizer, settings))


def build_train_features(
    dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings
) -> datasets.Dataset:
    """Every training window of ``dataset`` (one row per window; a long context gives several)."""
    return _map_windows(dataset, tokenizer, settings, kind="train", desc="Tokenising training questions",
                        make=train_features)


def build_eval_features(
    dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, settings: FeatureSettings
) -> datasets.Dataset:
    """Every evaluation window of ``dataset``, with ``example_id`` and ``offset_mapping`` for post-processing."""
    return _map_windows(dataset, tokenizer, settings, kind="eval", desc="Tokenising eval questions",
                        make=eval_features)
