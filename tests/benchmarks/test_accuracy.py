"""Smoke test of benchmarks.accuracy: the reference is exact, sampling perturbs factors, bf16 only the step."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import accuracy


def test_tiny_run_separates_the_two_levers(tmp_path: Path) -> None:
    out = tmp_path / "acc.json"
    res = accuracy.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--windows", "2",
                         "--variants", "1:fp32", "0.25:fp32", "1:bf16", "--out", str(out)])
    rows = {r["variant"]: r for r in res["rows"]}
    assert rows["1:fp32"]["factor_err_one_window"] == 0 and rows["1:fp32"]["precond_grad_err"] == 0
    assert rows["0.25:fp32"]["factor_err_one_window"] > 0.01  # a quarter of the tokens: visibly different factors
    assert rows["1:bf16"]["factor_err_one_window"] == 0  # decompositions in bf16 leave the factors alone...
    assert 0 < rows["1:bf16"]["precond_grad_err"] < 0.05  # ...and perturb the step by bf16 rounding only
    assert out.is_file() and out.with_suffix(".png").is_file()


def test_variants_must_start_with_the_exact_reference(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        accuracy.main(["--variants", "0.5:fp32", "1:fp32", "--out", str(tmp_path / "x.json")])


def test_pass_subsets_perturb_the_factors_and_keep_less_time(tmp_path: Path) -> None:
    res = accuracy.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--windows", "2", "--passes", "4",
                         "--variants", "1:fp32", "1:fp32:0.25", "--out", str(tmp_path / "acc.json")])
    rows = {r["variant"]: r for r in res["rows"]}
    assert rows["1:fp32:0.25"]["pass_fraction"] == 0.25
    assert rows["1:fp32:0.25"]["factor_err_one_window"] > 0.01  # one pass in four: different factors


TINY = ["--size", "tiny", "--batch", "2", "--seq", "16", "--windows", "1", "--variants", "1:fp32"]
BERT_VOCAB = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "bert-vocab" / "vocab.txt"
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_vocab_without_text_is_refused_not_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + [f"w{i}" for i in range(200)]) + "\n")
    with pytest.raises(SystemExit):
        accuracy.main([*TINY, "--vocab", str(vocab), "--out", str(tmp_path / "x.json")])
    assert "--vocab" in capsys.readouterr().err


@pytest.mark.parametrize("words", [5, 300])
def test_a_vocabulary_that_does_not_fit_the_text_is_refused_by_name(tmp_path: Path, words: int,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """5 words: far too small a vocabulary; 300: large enough, but none of the text's words are in it."""
    vocab, text = tmp_path / "vocab.txt", tmp_path / "text.txt"
    vocab.write_text("\n".join(SPECIAL + [f"zq{i}" for i in range(words)]) + "\n")
    text.write_text("the cat sat on the mat and looked at the hat . " * 200)
    with pytest.raises(SystemExit):
        accuracy.main([*TINY, "--text", str(text), "--vocab", str(vocab), "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert str(vocab) in err and ("[UNK]" in err or "tokens" in err)


@pytest.mark.skipif(not BERT_VOCAB.is_file(), reason=f"{BERT_VOCAB} absent")
def test_wikitext_marks_are_undone_as_bert_pretrain_reads_them(tmp_path: Path) -> None:
    """WikiText's " @-@ " / " @,@ " once reached the model as '@' tokens; bert_pretrain's reader undoes them."""
    from bert_pretrain.data.tokenizer import load_tokenizer

    text = tmp_path / "wiki.txt"
    text.write_text(" = Title = \n\n The well @-@ known 1 @,@ 000 people saw 2 @.@ 5 games . \n" * 40)
    batches = accuracy.text_batches(text, BERT_VOCAB, batch=2, seq=16, count=2)
    at = load_tokenizer(BERT_VOCAB).convert_tokens_to_ids("@")
    assert all(at not in b["input_ids"] and at not in b["masked_lm_ids"] for b in batches)
