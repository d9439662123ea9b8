"""Defect 1: a resume must never retrain the vocabulary into other token ids. Vocabulary training is
deterministic across processes, the prepared data is keyed by content (not mtime), and the built-in corpus is
not rewritten when its text is unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bert_pretrain.data.prepare import prepare_phase
from tests.support.bert_data import corpus_file
from tests.support.launch import REPO_ROOT

TRAIN = """
import sys
from pathlib import Path
from bert_pretrain.data.documents import read_documents
from bert_pretrain.data.tokenizer import train_vocab
train_vocab(read_documents([Path(sys.argv[1])]), Path(sys.argv[2]), vocab_size=int(sys.argv[3]))
"""


def _train_in_fresh_process(corpus: Path, out: Path, size: int) -> bytes:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", TRAIN, str(corpus), str(out), str(size)], check=True, env=env,
                   cwd=REPO_ROOT, timeout=120)
    return (out / "vocab.txt").read_bytes()


def test_vocabulary_training_is_the_same_in_every_process(tmp_path: Path) -> None:
    """tokenizers' trainer kept different tokens at the size limit in each process (hash-ordered ties)."""
    corpus = corpus_file(tmp_path, articles=150)
    files = [_train_in_fresh_process(corpus, tmp_path / f"v{i}", 2000) for i in range(3)]
    assert files[0] == files[1] == files[2]
    tokens = files[0].decode().split()
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(tokens) > 1000
    assert "born" in tokens and any(t.startswith("##") for t in tokens)


def test_touching_the_corpus_keeps_the_prepared_data_and_vocabulary(tmp_path: Path) -> None:
    corpus = corpus_file(tmp_path, articles=30)
    folder = prepare_phase([corpus], tmp_path / "data", phase=1, dupe_factor=1, num_proc=1)
    stamps = {p: p.stat().st_mtime_ns for p in (folder / "manifest.json", folder.parent / "vocab.txt")}
    corpus.write_bytes(corpus.read_bytes())  # what the mission did on every run: same text, new mtime
    os.utime(corpus, ns=(1, 10**18))
    prepare_phase([corpus], tmp_path / "data", phase=1, dupe_factor=1, num_proc=1)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # neither re-prepared nor retrained


def test_the_built_in_corpus_is_not_rewritten_when_unchanged(tmp_path: Path) -> None:
    corpus = corpus_file(tmp_path, articles=10)
    os.utime(corpus, ns=(1, 10**9))
    assert corpus_file(tmp_path, articles=10).stat().st_mtime_ns == 10**9
    assert corpus_file(tmp_path, articles=11).stat().st_mtime_ns != 10**9  # other text: rewritten
