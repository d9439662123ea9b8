"""Sentence-pair examples with masked tokens, following Google's create_pretraining_data.py.

Per document: sentences are packed into chunks up to a target length (with ``short_seq_prob`` a random shorter
one); a chunk is split into segment A and B, where B is the true continuation or (50%, and always for
one-sentence chunks) text from a random other document of the same pool, the unused sentences going back to
the document; 15% of the tokens (capped at ``max_predictions``) are selected, of which 80% become [MASK], 10% a
random ordinary token and 10% stay. Each (copy, document) pair has its own seeded RNG, so the result does not
depend on how the work is split across processes.

Stored as NVIDIA's BERT data is: padded ``input_ids``/``token_type_ids``/``attention_mask``, and the masked
``masked_lm_positions`` with their original ``masked_lm_ids`` padded to ``max_predictions`` (position 0, id -100),
so the model can gather exactly those positions with fixed shapes.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

IGNORE = -100  # label of padded prediction slots (cross_entropy's ignore_index)
# stored columns: (array typecode, numpy and datasets dtype); all but the label are sequences of a fixed length
# (max_seq_length or max_predictions)
COLUMNS = {"input_ids": ("i", "int32"), "token_type_ids": ("b", "int8"), "attention_mask": ("b", "int8"),
           "masked_lm_positions": ("i", "int32"), "masked_lm_ids": ("i", "int32"), "next_sentence_label": ("b", "int8")}


class Documents(Protocol):
    """Documents of sentences of token ids, by number: a list, or a DocumentTable reading them from disk."""

    def __getitem__(self, index: int, /) -> list[list[int]]: ...


def documents_of(docs: Documents, numbers: Sequence[int]) -> list[list[list[int]]]:
    """The documents ``numbers`` of ``docs`` (in one read when ``docs`` can, as a DocumentTable can)."""
    many = getattr(docs, "many", None)
    return many(numbers) if many is not None else [docs[int(i)] for i in numbers]


@dataclass(frozen=True)
class Specials:
    """The special-token ids masking and example building need, and the vocabulary's size (random replacements)."""

    pad: int
    cls: int
    sep: int
    mask: int
    vocab_size: int

    @classmethod
    def of(cls, tokenizer: Any) -> Specials:
        """The ids a HF BERT tokenizer gives its special tokens: the one place they are read."""
        ids = (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id)
        if any(i is None for i in ids):
            raise ValueError(f"{type(tokenizer).__name__} lacks a special token ([PAD] [CLS] [SEP] [MASK]: {ids}); "
                             "a BERT vocab.txt needs all of them")
        pad, cls_, sep, mask = (int(i) for i in ids)
        return cls(pad=pad, cls=cls_, sep=sep, mask=mask, vocab_size=len(tokenizer))


@dataclass(frozen=True)
class ExampleSettings:
    max_seq_length: int
    max_predictions: int
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 5
    seed: int = 12345


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer segment, from the front or the back at random, until the pair fits."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def mask_tokens(tokens: list[int], s: ExampleSettings, sp: Specials,
                rng: random.Random) -> tuple[list[int], list[int], list[int]]:
    """(masked input, sorted masked positions, original ids at those positions)."""
    candidates = [i for i, t in enumerate(tokens) if t not in (sp.cls, sp.sep)]
    rng.shuffle(candidates)
    n = min(s.max_predictions, max(1, round(len(tokens) * s.masked_lm_prob)))
    positions = sorted(candidates[:n])
    out = list(tokens)
    for i in positions:
        r = rng.random()
        if r < 0.8:
            out[i] = sp.mask
        elif r >= 0.9:  # a random ordinary token (never [CLS]/[SEP]/[MASK]/[PAD])
            while (token := rng.randint(0, sp.vocab_size - 1)) in (sp.cls, sp.sep, sp.mask, sp.pad):
                pass
            out[i] = token
    return out, positions, [tokens[i] for i in positions]


def _example(a: list[int], b: list[int], is_random: bool, s: ExampleSettings, sp: Specials,
             rng: random.Random) -> dict[str, Any]:
    tokens = [sp.cls, *a, sp.sep, *b, sp.sep]
    masked, positions, ids = mask_tokens(tokens, s, sp, rng)
    pad, pred_pad = s.max_seq_length - len(tokens), s.max_predictions - len(positions)
    return {"input_ids": masked + [sp.pad] * pad,
            "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * pad,
            "attention_mask": [1] * len(tokens) + [0] * pad,
            "masked_lm_positions": positions + [0] * pred_pad, "masked_lm_ids": ids + [IGNORE] * pred_pad,
            "next_sentence_label": int(is_random)}


def _random_segment(docs: Documents, index: int, pool: Sequence[int], length: int,
                    rng: random.Random) -> list[int]:
    """At least ``length`` tokens from a random place in a random other document of ``pool``."""
    other = index
    for _ in range(10):
        other = pool[rng.randint(0, len(pool) - 1)]
        if other != index:
            break
    document = docs[int(other)]
    out: list[int] = []
    for sentence in document[rng.randint(0, len(document) - 1):]:
        out.extend(sentence)
        if len(out) >= length:
            break
    return out


def document_examples(document: list[list[int]], index: int, docs: Documents, pool: Sequence[int],
                      s: ExampleSettings, sp: Specials, rng: random.Random) -> list[dict[str, Any]]:
    """All examples of one copy of ``document`` (number ``index``); random next segments come from the
    documents ``docs[i]`` of ``pool``."""
    max_tokens = s.max_seq_length - 3
    target = rng.randint(2, max_tokens) if rng.random() < s.short_seq_prob else max_tokens
    out: list[dict[str, Any]] = []
    chunk: list[list[int]] = []
    length, i = 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for seg in chunk[:a_end] for t in seg]
            is_random = len(pool) > 1 and (len(chunk) == 1 or rng.random() < 0.5)
            if is_random:
                b = _random_segment(docs, index, pool, target - len(a), rng)
                i -= len(chunk) - a_end  # the unused sentences start the next chunk
            else:
                b = [t for seg in chunk[a_end:] for t in seg]
            _truncate_pair(a, b, max_tokens, rng)
            if a and b:
                out.append(_example(a, b, is_random, s, sp, rng))
            chunk, length = [], 0
        i += 1
    return out


def rng_for(seed: int, copy: int, index: int) -> random.Random:
    return random.Random(f"{seed}/{copy}/{index}")


def batch_examples(batch: dict[str, list[Any]], indices: list[int], *, docs: Documents, pool: Sequence[int],
                   documents_per_copy: int, settings: ExampleSettings, specials: Specials) -> dict[str, Any]:
    """``datasets.map`` function (``with_indices``) over the pool's documents repeated once per copy: document
    numbers (``doc``, whose sentences are read from ``docs``) → example columns; row ``i`` is copy
    ``i // documents_per_copy``.

    The columns are numpy arrays (one row per example), filled example by example: a call's examples take ~1 KB
    each rather than the ~10 KB of Python lists, so a call can cover many documents (each call is one Arrow
    record batch of map()'s output, which costs heap wherever the output is opened)."""
    import numpy as np

    cols = {k: array(code) for k, (code, _) in COLUMNS.items()}
    documents = documents_of(docs, batch["doc"])
    for row, index, document in zip(indices, batch["doc"], documents, strict=True):
        rng = rng_for(settings.seed, row // documents_per_copy, index)
        for ex in document_examples(document, index, docs, pool, settings, specials, rng):
            for k, v in ex.items():
                if isinstance(v, list):
                    cols[k].extend(v)
                else:
                    cols[k].append(v)
    n = len(cols["next_sentence_label"])
    widths = {"input_ids": settings.max_seq_length, "token_type_ids": settings.max_seq_length,
              "attention_mask": settings.max_seq_length, "masked_lm_positions": settings.max_predictions,
              "masked_lm_ids": settings.max_predictions, "next_sentence_label": 0}
    return {k: np.frombuffer(cols[k], dtype=dtype).reshape((n, widths[k]) if widths[k] else (n,))
            for k, (_, dtype) in COLUMNS.items()}
