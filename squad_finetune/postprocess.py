"""Start/end logits of every window -> one answer text per question (the BERT n-best span search, batched).

Per window: the ``n_best`` highest start and end logits give ``n_best²`` candidate spans; spans that end before
they start, are longer than ``max_answer_length`` tokens or touch a non-context token are dropped; a span scores
start logit + end logit. Per question: the best candidate over all of its windows, mapped back to context
characters through the windows' offsets. Everything up to the final string slicing is tensor operations over all
windows at once, so post-processing the 10k windows of a SQuAD dev set takes well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kaisa_ds.enums import parse_count

NEG_INF = float("-inf")


@dataclass(frozen=True)
class SpanSearch:
    """Search limits (defaults: BERT's SQuAD settings)."""

    n_best: int = 20
    max_answer_length: int = 30

    def __post_init__(self) -> None:
        parse_count("n_best", self.n_best, meaning="start and end logits kept per window")
        parse_count("max_answer_length", self.max_answer_length, meaning="tokens in the longest answer span")


def top_spans_per_window(
    start_logits: torch.Tensor, end_logits: torch.Tensor, context_mask: torch.Tensor, search: SpanSearch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``n_best`` best valid spans of each window: (scores, start tokens, end tokens), each (F, n).

    Inputs are (F, L). A window with fewer valid spans pads with score -inf.
    """
    k = min(search.n_best, start_logits.shape[1])
    start_val, start_idx = start_logits.float().topk(k, dim=1)  # (F, k)
    end_val, end_idx = end_logits.float().topk(k, dim=1)
    length = end_idx[:, None, :] - start_idx[:, :, None]  # (F, k, k): end - start
    valid = (
        context_mask.gather(1, start_idx)[:, :, None]
        & context_mask.gather(1, end_idx)[:, None, :]
        & (length >= 0)
        & (length < search.max_answer_length)
    )
    scores = (start_val[:, :, None] + end_val[:, None, :]).masked_fill(~valid, NEG_INF).flatten(1)
    n = min(search.n_best, k * k)
    top_scores, flat = scores.topk(n, dim=1)
    return top_scores, start_idx.gather(1, flat // k), end_idx.gather(1, flat % k)


def _window_rank(feature_example: torch.Tensor, num_examples: int) -> torch.Tensor:
    """Position of each window among its question's windows (0, 1, ...), in feature order."""
    order = torch.argsort(feature_example, stable=True)
    counts = torch.bincount(feature_example, minlength=num_examples)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(feature_example)
    rank[order] = torch.arange(feature_example.numel()) - first[feature_example[order]]
    return rank


def predict_answers(
    *,
    example_ids: Sequence[str],
    contexts: Sequence[str],
    feature_example: torch.Tensor,
    offsets: torch.Tensor,
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    search: SpanSearch,
) -> dict[str, str]:
    """Question id -> predicted answer text ("" when no window has a valid span).

    ``feature_example`` (F,) is each window's index into ``example_ids``/``contexts``; ``offsets`` (F, L, 2)
    holds context tokens' character offsets and -1 elsewhere (padding included); logits are (F, L).
    """
    if len(example_ids) != len(contexts):
        raise ValueError(f"{len(example_ids)} example ids but {len(contexts)} contexts")
    if not (offsets.shape[:2] == start_logits.shape == end_logits.shape == (feature_example.numel(), offsets.shape[1])):
        raise ValueError(f"shape mismatch: offsets {tuple(offsets.shape)}, start {tuple(start_logits.shape)}, "
                         f"end {tuple(end_logits.shape)}, windows {feature_example.numel()}")
    num_examples = len(example_ids)
    scores, start_tok, end_tok = top_spans_per_window(start_logits, end_logits, offsets[..., 0] >= 0, search)
    char_start = offsets[..., 0].gather(1, start_tok)  # (F, n)
    char_end = offsets[..., 1].gather(1, end_tok)
    rank = _window_rank(feature_example, num_examples)
    max_windows = int(rank.max().item()) + 1 if rank.numel() else 1
    n = scores.shape[1]
    table = torch.full((num_examples, max_windows, n), NEG_INF)
    table[feature_example, rank] = scores
    best = table.flatten(1).argmax(dim=1)  # (E,) flat (window, candidate) index
    best_score = table.flatten(1).gather(1, best[:, None]).squeeze(1)
    where = torch.full((num_examples, max_windows), -1, dtype=torch.long)
    where[feature_example, rank] = torch.arange(feature_example.numel())
    feature = where.gather(1, (best // n)[:, None]).squeeze(1)
    candidate = best % n
    found = torch.isfinite(best_score) & (feature >= 0)
    safe_feature = feature.clamp(min=0)
    starts = char_start[safe_feature, candidate].tolist()
    ends = char_end[safe_feature, candidate].tolist()
    return {
        qid: (context[s:e] if ok else "")
        for qid, context, s, e, ok in zip(example_ids, contexts, starts, ends, found.tolist())
    }
