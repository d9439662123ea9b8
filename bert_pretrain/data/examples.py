"""Sentence-pair examples with masked tokens, following Google's create_pretraining_data.py.

Per document: sentences are packed into chunks up to a target length (shorter with ``short_seq_prob``); a
chunk is split into segment A and B, where B is the true continuation or (50%, and always for one-sentence
chunks) text from a random other document; 15% of the tokens (capped at ``max_predictions``) are selected,
of which 80% become [MASK], 10% a random token and 10% stay. Each document/copy pair has its own seeded RNG, so
the result does not depend on how the work is split across processes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Specials:
    pad: int
    cls: int
    sep: int
    mask: int
    vocab_size: int


@dataclass(frozen=True)
class ExampleSettings:
    max_seq_length: int
    max_predictions: int
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 5
    seed: int = 12345


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def _mask(tokens: list[int], s: ExampleSettings, sp: Specials, rng: random.Random) -> tuple[list[int], list[int]]:
    """Masked input and labels (-100 where nothing is predicted)."""
    candidates = [i for i, t in enumerate(tokens) if t not in (sp.cls, sp.sep)]
    rng.shuffle(candidates)
    n = min(s.max_predictions, max(1, round(len(tokens) * s.masked_lm_prob)))
    labels = [-100] * len(tokens)
    out = list(tokens)
    for i in sorted(candidates[:n]):
        labels[i] = tokens[i]
        r = rng.random()
        if r < 0.8:
            out[i] = sp.mask
        elif r >= 0.9:
            out[i] = rng.randint(0, sp.vocab_size - 1)
    return out, labels


def document_examples(docs: list[list[list[int]]], index: int, s: ExampleSettings, sp: Specials,
                      rng: random.Random) -> list[dict[str, Any]]:
    """All examples of one document (one copy); ``docs`` are documents of tokenised sentences."""
    document = docs[index]
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
            b: list[int] = []
            is_random = len(chunk) == 1 or rng.random() < 0.5
            if is_random and len(docs) > 1:
                other = index
                for _ in range(10):
                    other = rng.randint(0, len(docs) - 1)
                    if other != index:
                        break
                rdoc = docs[other]
                for seg in rdoc[rng.randint(0, len(rdoc) - 1):]:
                    b.extend(seg)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end  # the unused sentences start the next chunk
            else:
                is_random = False
                b = [t for seg in chunk[a_end:] for t in seg]
            _truncate_pair(a, b, max_tokens, rng)
            if a and b:
                tokens = [sp.cls, *a, sp.sep, *b, sp.sep]
                types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                masked, labels = _mask(tokens, s, sp, rng)
                pad = s.max_seq_length - len(tokens)
                out.append({"input_ids": masked + [sp.pad] * pad, "token_type_ids": types + [0] * pad,
                            "attention_mask": [1] * len(tokens) + [0] * pad, "mlm_labels": labels + [-100] * pad,
                            "next_sentence_label": int(is_random)})
            chunk, length = [], 0
        i += 1
    return out


def rng_for(seed: int, copy: int, index: int) -> random.Random:
    return random.Random(seed * 1_000_003 + copy * 7_919 + index)


def batch_examples(batch: dict[str, list[Any]], *, docs: list[list[list[int]]], settings: ExampleSettings,
                   specials: Specials) -> dict[str, list[Any]]:
    """``datasets.map`` function: rows (copy, doc) → example columns."""
    cols: dict[str, list[Any]] = {k: [] for k in ("input_ids", "token_type_ids", "attention_mask", "mlm_labels",
                                                   "next_sentence_label")}
    for copy, index in zip(batch["copy"], batch["doc"]):
        for ex in document_examples(docs, index, settings, specials, rng_for(settings.seed, copy, index)):
            for k, v in ex.items():
                cols[k].append(v)
    return cols
