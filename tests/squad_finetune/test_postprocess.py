"""The batched n-best span search picks the right span on synthetic logits, and agrees with BERT's loop."""

from __future__ import annotations

import pytest
import torch

from squad_finetune.postprocess import SpanSearch, predict_answers, top_spans_per_window

CONTEXT = "alpha beta gamma delta epsilon zeta eta theta"
WORDS = CONTEXT.split()
STARTS = [CONTEXT.index(w) for w in WORDS]


def _offsets(first_word: int, n_words: int, length: int) -> torch.Tensor:
    """A window: [CLS] q [SEP] then ``n_words`` context words from ``first_word``, then [SEP] and padding."""
    off = torch.full((length, 2), -1, dtype=torch.long)
    for j in range(n_words):
        w = first_word + j
        off[3 + j] = torch.tensor([STARTS[w], STARTS[w] + len(WORDS[w])])
    return off


def test_best_span_across_windows_ignores_invalid_candidates() -> None:
    length = 10
    offsets = torch.stack([_offsets(0, 5, length), _offsets(3, 5, length), _offsets(0, 4, length)])
    start = torch.full((3, length), -10.0)
    end = torch.full((3, length), -10.0)
    # window 0 (words 0-4 at positions 3-7): best valid span "beta gamma" scores 2 + 2 = 4
    start[0, 4], end[0, 5] = 2.0, 2.0
    # ... and higher but invalid candidates: [CLS] logits, and an end (word 0) before the start (word 4)
    start[0, 0], end[0, 0] = 50.0, 50.0
    start[0, 7], end[0, 3] = 9.0, 9.0
    # window 1 (words 3-7): "eta" scores 3 + 3 = 6, the question's best over both windows
    start[1, 6], end[1, 6] = 3.0, 3.0
    # window 2 belongs to the second question: only padding has high logits -> its best context span wins
    start[2, 9], end[2, 9] = 20.0, 20.0
    start[2, 5], end[2, 6] = 1.0, 1.0
    preds = predict_answers(
        example_ids=["q0", "q1"], contexts=[CONTEXT, CONTEXT], feature_example=torch.tensor([0, 0, 1]),
        offsets=offsets, start_logits=start, end_logits=end, search=SpanSearch(n_best=20, max_answer_length=30),
    )
    assert preds == {"q0": "eta", "q1": "gamma delta"}


def test_max_answer_length_limits_span() -> None:
    length = 12
    offsets = _offsets(0, 8, length)[None]
    start = torch.zeros(1, length)
    end = torch.zeros(1, length)
    start[0, 3], end[0, 10] = 5.0, 5.0  # "alpha ... theta": 8 tokens
    end[0, 4] = 4.0  # "alpha beta": 2 tokens
    common = dict(example_ids=["q"], contexts=[CONTEXT], feature_example=torch.tensor([0]), offsets=offsets,
                  start_logits=start, end_logits=end)
    assert predict_answers(**common, search=SpanSearch(max_answer_length=8)) == {"q": CONTEXT}  # type: ignore[arg-type]
    assert predict_answers(**common, search=SpanSearch(max_answer_length=7)) == {"q": "alpha beta"}  # type: ignore[arg-type]


def test_question_without_valid_span_gets_empty_answer() -> None:
    offsets = torch.full((1, 6, 2), -1, dtype=torch.long)  # no context token at all
    preds = predict_answers(example_ids=["q", "unseen"], contexts=[CONTEXT, CONTEXT],
                            feature_example=torch.tensor([0]), offsets=offsets, start_logits=torch.randn(1, 6),
                            end_logits=torch.randn(1, 6), search=SpanSearch())
    assert preds == {"q": "", "unseen": ""}


def _reference_window(start: list[float], end: list[float], ctx: list[bool], n_best: int, max_len: int) -> tuple:
    """BERT's run_squad.py loop for one window: best (score, start, end) among top-n starts x top-n ends."""
    top_s = sorted(range(len(start)), key=lambda i: -start[i])[:n_best]
    top_e = sorted(range(len(end)), key=lambda i: -end[i])[:n_best]
    best = (float("-inf"), -1, -1)
    for s in top_s:
        for e in top_e:
            if not (ctx[s] and ctx[e]) or e < s or e - s + 1 > max_len:
                continue
            best = max(best, (start[s] + end[e], s, e))
    return best


def test_matches_reference_loop_on_random_logits() -> None:
    gen = torch.Generator().manual_seed(0)
    windows, length = 64, 50
    start = torch.randn(windows, length, generator=gen)
    end = torch.randn(windows, length, generator=gen)
    ctx = torch.rand(windows, length, generator=gen) > 0.3
    search = SpanSearch(n_best=7, max_answer_length=5)
    scores, s_tok, e_tok = top_spans_per_window(start, end, ctx, search)
    assert torch.all(scores[:, :-1] >= scores[:, 1:])  # sorted best first
    for w in range(windows):
        ref = _reference_window(start[w].tolist(), end[w].tolist(), ctx[w].tolist(), 7, 5)
        if ref[0] == float("-inf"):
            assert scores[w, 0].item() == float("-inf")
            continue
        assert (s_tok[w, 0].item(), e_tok[w, 0].item()) == (ref[1], ref[2])
        assert abs(scores[w, 0].item() - ref[0]) < 1e-5
    assert torch.isfinite(scores[:, 0]).sum() > windows // 2  # the comparison is not vacuous


@pytest.mark.parametrize("kwargs", [dict(n_best=0), dict(max_answer_length=True), dict(max_answer_length=2.5)])
def test_bad_search_limits_named(kwargs: dict[str, object]) -> None:
    """A limit that is not an integer >= 1 is refused with its name and what it counts."""
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"{name}=.*integer >= 1 \(\w"):
        SpanSearch(**kwargs)  # type: ignore[arg-type]
