"""A deterministic WordPiece vocabulary learner (BPE merges with ``##`` continuation pieces).

Why not ``tokenizers``' trainer: its merge queue breaks count ties by symbol ids that it assigns in the
iteration order of a randomly seeded Rust hash map (the alphabet is sorted with an unstable sort over it), so
two runs on the same corpus keep different tokens near the size limit, even with ``RAYON_NUM_THREADS=1``.
A resumed run would then get other token ids than its checkpoint. Here every tie is broken by the symbols
themselves, so the vocabulary depends only on the word counts. Words are split exactly as the BERT tokenizer
splits them (``tokenizers``' BertNormalizer and BertPreTokenizer, both deterministic).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable

PREFIX = "##"
LIMIT_ALPHABET = 1000  # as tokenizers' BertWordPieceTokenizer: rarer characters become [UNK]


def word_counts(sentences: Iterable[str], *, lower_case: bool) -> Counter[str]:
    """How often each pre-tokenised word occurs, normalised as ``BertTokenizerFast`` does."""
    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer

    norm, pre = BertNormalizer(lowercase=lower_case), BertPreTokenizer()
    counts: Counter[str] = Counter()
    for sentence in sentences:
        counts.update(word for word, _ in pre.pre_tokenize_str(norm.normalize_str(sentence)))
    return counts


def _pairs(word: list[str]) -> Iterable[tuple[str, str]]:
    return itertools.pairwise(word)


def learn_vocab(counts: Counter[str], *, vocab_size: int, specials: list[str], min_frequency: int = 2) -> list[str]:
    """Specials, then the alphabet, then merged pieces in merge order, up to ``vocab_size`` tokens.

    The most frequent adjacent pair is merged first; ties go to the lexicographically smallest pair."""
    chars: Counter[str] = Counter()
    for word, n in counts.items():
        for ch in word:
            chars[ch] += n
    alphabet = {ch for ch, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))[:LIMIT_ALPHABET]}
    words: list[list[str]] = []
    freq: list[int] = []
    for word, n in sorted(counts.items()):
        if all(ch in alphabet for ch in word):
            words.append([word[0]] + [PREFIX + ch for ch in word[1:]])
            freq.append(n)
    vocab = list(dict.fromkeys([*specials, *sorted({s for w in words for s in w})]))
    pair_count: defaultdict[tuple[str, str], int] = defaultdict(int)
    where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for i, w in enumerate(words):
        for pair in _pairs(w):
            pair_count[pair] += freq[i]
            where[pair].add(i)
    heap = [(-n, pair) for pair, n in pair_count.items()]
    heapq.heapify(heap)
    known = set(vocab)
    while len(vocab) < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        if -neg != pair_count.get(pair, 0):
            continue  # stale entry: the count changed since it was pushed
        if -neg < min_frequency:
            break
        merged = pair[0] + pair[1][len(PREFIX):]
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair, set())):
            old = words[i]
            for p in _pairs(old):
                pair_count[p] -= freq[i]
                changed.add(p)
            new: list[str] = []
            k = 0
            while k < len(old):
                if k + 1 < len(old) and (old[k], old[k + 1]) == pair:
                    new.append(merged)
                    k += 2
                else:
                    new.append(old[k])
                    k += 1
            words[i] = new
            for p in _pairs(new):
                pair_count[p] += freq[i]
                where[p].add(i)
                changed.add(p)
        pair_count.pop(pair, None)
        for p in changed:
            if pair_count.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    return vocab
