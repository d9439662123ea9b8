"""The one place a BERT tokenizer is built from a vocabulary, with its casing and [UNK]-coverage checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from bert_pretrain.data.errors import DataError
from bert_pretrain.data.tokenizer import (
    SPECIAL,
    check_coverage,
    check_vocab_size,
    count_unknown,
    is_cased,
    load_tokenizer,
)
from tests.support.bert_data import BERT_VOCAB, SHARED_ABSENT, WIKITEXT_VALID, real_data_present

pytestmark = pytest.mark.skipif(not real_data_present(), reason=SHARED_ABSENT)


def wikitext_lines(count: int = 400) -> list[str]:
    lines = [ln.replace(" @-@ ", "-") for ln in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines()
             if ln.strip() and not ln.strip().startswith("=")]
    return lines[:count]


def test_bert_vocab_loads_whole_and_covers_real_text() -> None:
    tok = load_tokenizer(BERT_VOCAB, check_case=True)
    assert len(tok) == 30522  # the 5-token tokenizer of `vocab_file=` would fail this
    unknown, total = count_unknown(tok, wikitext_lines())
    assert total > 10_000
    share = check_coverage(unknown=unknown, total=total, data="wikitext", source="bert vocab")
    assert share < 0.05


def test_cased_tokenization_with_uncased_vocab_is_refused() -> None:
    assert not is_cased(BERT_VOCAB.read_text(encoding="utf-8").splitlines())
    with pytest.raises(DataError, match=r"--cased.*uncased"):
        load_tokenizer(BERT_VOCAB, lower_case=False, check_case=True)
    # without the check, capitalised words silently become [UNK]: the share the check exists for
    tok = load_tokenizer(BERT_VOCAB, lower_case=False)
    unknown, total = count_unknown(tok, wikitext_lines())
    assert 0.05 < unknown / total < 0.2  # under the 20% refusal: why casing needs its own check


def test_cased_vocab_is_recognised(tmp_path: Path) -> None:
    words = ["Paris", "London", "the", "city", "River", "##s"] * 1
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + words) + "\n", encoding="utf-8")
    assert is_cased(vocab.read_text(encoding="utf-8").splitlines())
    load_tokenizer(vocab, lower_case=False, check_case=True)  # cased text with a cased vocabulary: accepted
    with pytest.raises(DataError, match=r"--vocab .* is a cased vocabulary .*pass --cased"):
        load_tokenizer(vocab, lower_case=True, check_case=True)  # lower-cased text loses what it was made for


def test_tiny_vocab_and_unknown_text_are_refused_by_name(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL) + "\n", encoding="utf-8")
    tok = load_tokenizer(vocab)
    with pytest.raises(DataError, match=r"--vocab .*vocab.txt has 5 tokens"):
        check_vocab_size(tok, source=f"--vocab {vocab}")
    unknown, total = count_unknown(tok, wikitext_lines(50))
    with pytest.raises(DataError, match=r"corpus.txt: 100% of its .* tokens are \[UNK\].*--max-unk-rate"):
        check_coverage(unknown=unknown, total=total, data="corpus.txt", source="--vocab x")
    with pytest.raises(DataError, match="no tokens"):
        check_coverage(unknown=0, total=0, data="empty.txt", source="--vocab x")
