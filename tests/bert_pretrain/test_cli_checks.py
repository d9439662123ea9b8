"""Flags that another flag would make ineffective, or that would train on the wrong input, are refused before any
work by ``bert_pretrain.preflight.check_args`` (issue 21: a run that ends with rc 0 on the wrong setup)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bert_pretrain.cli import build_parser
from bert_pretrain.data.documents import DataError
from bert_pretrain.data.tokenizer import train_vocab
from bert_pretrain.preflight import check_args
from kaisa_ds.plan.bert_sizes import SIZES
from tests.support.bert_data import (
    BERT_VOCAB,
    SHARED_ABSENT,
    WIKITEXT_VALID,
    corpus_file,
    real_data_present,
    wikitext_excerpt,
)
from tests.support.launch import REPO_ROOT

needs_real_data = pytest.mark.skipif(not real_data_present(), reason=SHARED_ABSENT)
CONFIG = REPO_ROOT / "ds_configs" / "bert_tiny_phase1.json"


def _check(tmp: Path, *extra: str, phase: int = 1) -> None:
    check_args(build_parser().parse_args(["--phase", str(phase), "--config", str(CONFIG), "--output",
                                          str(tmp / "run"), *extra]))


def _checkpoint(folder: Path, size: str, *, vocab: Path | None = None) -> Path:
    """A model folder as far as the checks read it: config.json of a named size (and a vocab.txt)."""
    hidden, layers, heads, inter = SIZES[size]
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "intermediate_size": inter}))
    if vocab is not None:
        (folder / "vocab.txt").write_bytes(vocab.read_bytes())
    return folder


@pytest.fixture(scope="module")
def cased_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cased WordPiece vocabulary learnt on WikiText (as a cased BERT vocabulary, it keeps capitals)."""
    lines = [ln for ln in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines()[:1500] if ln.strip()]
    return train_vocab([lines], tmp_path_factory.mktemp("cased"), vocab_size=1000, lower_case=False)


@needs_real_data
def test_cased_run_with_the_uncased_bert_vocab_is_refused_by_the_cli(tmp_path: Path) -> None:
    """`python -m bert_pretrain --cased --vocab <bert-base-uncased>` used to train with every capitalised word
    as [UNK] (about 10% of WikiText's tokens, under the 20% [UNK] refusal)."""
    text = wikitext_excerpt(tmp_path / "wiki.txt", lines=600)
    proc = subprocess.run(
        [sys.executable, "-m", "bert_pretrain", "--phase", "1", "--config", str(CONFIG), "--vocab", str(BERT_VOCAB),
         "--cased", "--data", str(text), "--output", str(tmp_path / "run"), "--max-steps", "1"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"--cased with --vocab {BERT_VOCAB}: that vocabulary is uncased" in proc.stderr
    assert "leave --cased out" in proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


@needs_real_data
def test_uncased_run_with_a_cased_vocab_is_refused(tmp_path: Path, cased_vocab: Path) -> None:
    """Lower-casing text for a cased vocabulary loses the capitals it was made for and leaves its capitalised
    tokens (a fifth of them) unused; the run must say --cased."""
    with pytest.raises(DataError, match=r"--vocab .* is a cased vocabulary.*pass --cased"):
        _check(tmp_path, "--vocab", str(cased_vocab))
    _check(tmp_path, "--vocab", str(cased_vocab), "--cased")  # the matching pairs pass
    _check(tmp_path, "--vocab", str(BERT_VOCAB))


@needs_real_data
def test_casing_of_the_init_checkpoints_vocab_is_checked(tmp_path: Path) -> None:
    """Phase 2 takes the vocabulary of --init-checkpoint: --cased with an uncased one is the same mistake."""
    ckpt = _checkpoint(tmp_path / "final", "tiny", vocab=BERT_VOCAB)
    with pytest.raises(DataError, match=r"--cased with --init-checkpoint .*vocab.txt: that vocabulary is uncased"):
        _check(tmp_path, "--init-checkpoint", str(ckpt), "--cased", phase=2)
    _check(tmp_path, "--init-checkpoint", str(ckpt), phase=2)


@needs_real_data
def test_vocab_other_than_the_init_checkpoints_is_refused(tmp_path: Path, cased_vocab: Path) -> None:
    """A --vocab of another content than the one the checkpoint learnt would scramble its token ids (same size:
    the model's size check cannot see it)."""
    ckpt = _checkpoint(tmp_path / "final", "tiny", vocab=cased_vocab)
    other = tmp_path / "other.txt"
    lines = cased_vocab.read_text(encoding="utf-8").splitlines()
    other.write_text("\n".join(lines[:5] + lines[5:][::-1]) + "\n", encoding="utf-8")  # same tokens, other ids
    with pytest.raises(DataError, match=r"--vocab .*other.txt differs from .*final/vocab.txt"):
        _check(tmp_path, "--init-checkpoint", str(ckpt), "--vocab", str(other), "--cased", phase=2)
    _check(tmp_path, "--init-checkpoint", str(ckpt), "--vocab", str(cased_vocab), "--cased", phase=2)


def test_model_size_other_than_the_init_checkpoints_is_refused(tmp_path: Path) -> None:
    """--init-checkpoint decides the model; a --model-size naming another size was silently ignored."""
    ckpt = _checkpoint(tmp_path / "final", "tiny")
    with pytest.raises(DataError, match=r"--model-size mini does not match --init-checkpoint .*final, which holds "
                                        r"a tiny model"):
        _check(tmp_path, "--init-checkpoint", str(ckpt), "--model-size", "mini", phase=2)
    _check(tmp_path, "--init-checkpoint", str(ckpt), "--model-size", "tiny", phase=2)  # the same size: accepted
    _check(tmp_path, "--init-checkpoint", str(ckpt), phase=2)


def test_vocab_size_without_a_trained_vocab_is_refused(tmp_path: Path) -> None:
    """--vocab-size sizes a vocabulary trained on the corpus; beside --vocab it was ignored."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" + "\n".join(f"w{i}" for i in range(200)) + "\n")
    with pytest.raises(DataError, match=r"--vocab-size 500 .* --vocab"):
        _check(tmp_path, "--vocab", str(vocab), "--vocab-size", "500")
    ckpt = _checkpoint(tmp_path / "final", "tiny", vocab=vocab)
    with pytest.raises(DataError, match=r"--vocab-size 500 .* --init-checkpoint"):
        _check(tmp_path, "--init-checkpoint", str(ckpt), "--vocab-size", "500", phase=2)


def test_articles_with_data_is_refused(tmp_path: Path) -> None:
    """--articles sizes the built-in corpus, which --data replaces."""
    text = corpus_file(tmp_path, articles=8)
    with pytest.raises(DataError, match=r"--articles 50 .*--data"):
        _check(tmp_path, "--data", str(text), "--articles", "50")


def test_from_scratch_with_init_checkpoint_is_refused(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "final", "tiny")
    with pytest.raises(DataError, match=r"--from-scratch .*--init-checkpoint"):
        _check(tmp_path, "--init-checkpoint", str(ckpt), "--from-scratch", phase=2)


def test_table_flags_without_a_table_are_refused(tmp_path: Path) -> None:
    """--data-split and --text-column choose a split and a column of table inputs; with text files only they were
    ignored (a user meaning a DatasetDict's validation split trained on something else)."""
    text = corpus_file(tmp_path, articles=8)
    with pytest.raises(DataError, match=r"--data-split validation: no --data or --eval-data input is a DatasetDict"):
        _check(tmp_path, "--data", str(text), "--data-split", "validation")
    with pytest.raises(DataError, match=r"--text-column body: no --data or --eval-data input is a table"):
        _check(tmp_path, "--data", str(text), "--text-column", "body")
    table = tmp_path / "rows.jsonl"
    table.write_text(json.dumps({"body": "One. Two."}) + "\n")
    _check(tmp_path, "--data", str(text), str(table), "--text-column", "body")
    _check(tmp_path, "--data", str(text), "--eval-data", f"rows={table}", "--text-column", "body")


@pytest.mark.parametrize("extra, named", [(("--stop-at-heldout", "-1"), "finite number > 0"),
                                          (("--stop-at-heldout", "nan"), "finite number > 0"),
                                          (("--stop-at-heldout", "3", "--eval-data", "x=y.txt"), "--eval-data")])
def test_a_stop_loss_that_can_never_apply_is_refused(tmp_path: Path, extra: tuple[str, ...], named: str) -> None:
    """--stop-at-heldout reads the loss on the documents held out of --data: a loss <= 0 or NaN can never be met
    and --eval-data replaces that evaluation, so either would silently run the whole phase."""
    with pytest.raises(DataError, match="--stop-at-heldout") as err:
        _check(tmp_path, *extra)
    assert named in str(err.value)
