"""Defects 7 and 8: bad inputs are refused with exit code 2 and a message naming the culprit (file or flag),
before anything heavy runs, instead of training on garbage with rc 0 or dying in a raw traceback."""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.bert_data import corpus_file
from tests.support.launch import REPO_ROOT

CONFIG = "ds_configs/bert_tiny_phase1.json"


def _binary(path: Path) -> Path:
    path.write_bytes(random.Random(0).randbytes(20_000))
    return path


def _latin1(path: Path) -> Path:
    path.write_bytes("Le café était fermé. Il a répondu à José.\n\nUn élève arrivé. Très bien.\n".encode("latin-1")
                     * 20)
    return path


def _vocab(path: Path, words: list[str]) -> Path:
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    return path


def _bad_jsonl(path: Path) -> Path:
    path.write_text('{"text": "A fine first record. It parses."}\n{"text": "a broken second\n')
    return path


def _parquet_without_text(path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2], "body": ["One. Two.", "Three. Four."]}), path)
    return path


def _cut_gzip(path: Path, corpus: Path) -> Path:
    path.write_bytes(gzip.compress(corpus.read_bytes())[:-300])  # truncated: no end-of-stream marker
    return path


def _empty_dataset(path: Path) -> Path:
    from datasets import Dataset

    Dataset.from_dict({"text": []}).save_to_disk(str(path))
    return path


NOT_ENGLISH = [f"zz{i}" for i in range(200)]  # a well-formed vocabulary that covers none of the corpus
# (id, make the arguments from a scratch folder with a small good corpus in it, the text the message must hold,
#  whether it is refused before any data preparation)
Case = tuple[str, Callable[[Path, Path], list[str]], str, bool]
CASES: list[Case] = [
    ("binary-data", lambda t, c: ["--data", str(_binary(t / "random.bin"))], "random.bin looks binary", True),
    ("latin1-data", lambda t, c: ["--data", str(_latin1(t / "latin.txt"))], "latin.txt is not valid utf-8", True),
    ("tiny-vocab", lambda t, c: ["--data", str(c), "--vocab", str(_vocab(t / "v7.txt", ["the", "a"]))],
     "v7.txt has 7 tokens", False),
    ("mostly-unk", lambda t, c: ["--data", str(c), "--vocab", str(_vocab(t / "vz.txt", NOT_ENGLISH))],
     "--max-unk-rate", False),
    ("jsonl-bad-line", lambda t, c: ["--data", str(_bad_jsonl(t / "bad.jsonl"))],
     "--data: {t}/bad.jsonl line 2 is not valid JSON", True),
    ("parquet-without-column", lambda t, c: ["--data", str(_parquet_without_text(t / "nocol.parquet"))],
     "--data: {t}/nocol.parquet has no column 'text'; its columns are id, body", True),
    ("truncated-gzip", lambda t, c: ["--data", str(_cut_gzip(t / "cut.txt.gz", c))],
     "--data: {t}/cut.txt.gz is not a readable gzip file", True),
    ("empty-datasets-folder", lambda t, c: ["--data", str(_empty_dataset(t / "emptyds"))],
     "--data: {t}/emptyds holds no rows", True),
    ("unknown-extension", lambda t, c: ["--data", str(_copy(c, t / "corpus.csv"))],
     "--data: {t}/corpus.csv: .csv files are not read", True),
    ("binary-vocab", lambda t, c: ["--data", str(c), "--vocab", str(_binary(t / "vocab.bin"))],
     "--vocab: {t}/vocab.bin is not a UTF-8 text file", True),
    ("binary-config", lambda t, c: ["--data", str(c), "--config", str(_binary(t / "cfg.json"))],
     "--config {t}/cfg.json", True),
    ("missing-init-checkpoint", lambda t, c: ["--data", str(c), "--init-checkpoint", str(t / "nope")],
     "--init-checkpoint {t}/nope", True),
    ("phase2-from-random", lambda t, c: ["--data", str(c), "--phase", "2"], "--phase 2 without --init-checkpoint",
     True),
    ("max-steps-0", lambda t, c: ["--data", str(c), "--max-steps", "0"], "--max-steps", True),
    ("eval-every-0", lambda t, c: ["--data", str(c), "--eval-every", "0"], "--eval-every", True),
    ("negative-save-every", lambda t, c: ["--data", str(c), "--save-every", "-1"], "--save-every", True),
    ("unwritable-output", lambda t, c: ["--data", str(c), "--output", str(c / "run")], "--output {c}/run", True),
    ("output-holds-a-run", lambda t, c: ["--data", str(c), "--output", str(_finished_run(t / "done"))],
     "--output {t}/done already holds a run", True),
]


def _copy(source: Path, path: Path) -> Path:
    path.write_bytes(source.read_bytes())
    return path


def _finished_run(folder: Path) -> Path:
    folder.mkdir()
    (folder / "summary.json").write_text('{"steps": 10}')
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus_file(tmp_path_factory.mktemp("corpus"), articles=20)


@pytest.mark.parametrize(("make", "culprit", "early"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_the_culprit(tmp_path: Path, corpus: Path, make: Callable[[Path, Path], list[str]],
                                                 culprit: str, early: bool) -> None:
    args = ["--phase", "1", "--config", CONFIG, "--output", str(tmp_path / "run"), "--max-steps", "2",
            "--data-cache", str(tmp_path / "data"), "--dupe-factor", "1", *make(tmp_path, corpus)]
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "bert_pretrain", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert culprit.format(t=tmp_path, c=corpus) in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    if early:  # found before the vocabulary was trained or copied, i.e. before any data preparation
        assert not (tmp_path / "data" / "vocab.txt").exists()
    assert time.perf_counter() - start < 120


def test_an_explicit_encoding_keeps_the_accented_letters(tmp_path: Path) -> None:
    from bert_pretrain.data.documents import read_documents

    docs = read_documents([_latin1(tmp_path / "latin.txt")], encoding="latin-1")
    assert docs[0][0] == "Le café était fermé." and "\ufffd" not in str(docs)
