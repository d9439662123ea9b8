"""The main job is deterministic: its pretraining stage run twice from scratch on the built-in data (corpus,
vocabulary, examples, K-FAC training) gives the same metrics to within float noise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bert_pretrain.data.tokenizer import vocab_digest
from tests.support.launch import run_deepspeed

TIMING = {"seq_per_s", "elapsed_s", "kfac_ms"}  # wall-clock figures differ between runs by nature
BERT_VOCAB = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "bert-vocab" / "vocab.txt"


def _pretrain(folder: Path, *extra: str) -> list[dict[str, Any]]:
    """Phase 1 as the main job runs it (K-FAC config, built-in corpus, its own fresh data cache), a few steps."""
    run_deepspeed(["--module", "bert_pretrain", "--phase", "1", "--config", "ds_configs/bert_tiny_phase1_kfac.json",
                   "--output", str(folder / "phase1"), "--data-cache", str(folder / "data"), "--articles", "100",
                   "--max-steps", "4", "--eval-every", "2", "--eval-examples", "64", "--save-every", "0",
                   "--dupe-factor", "2", *extra])
    return [json.loads(line) for line in (folder / "phase1" / "metrics.jsonl").read_text().splitlines()]


def _flat(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested values (the ``kfac`` diagnostics) as ``kfac.eigenvalues.<group>.min`` keys, timings left out."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in TIMING:
            continue
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same_metrics(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> None:
    assert len(first) == len(second) == 4
    for a, b in zip(map(_flat, first), map(_flat, second)):
        assert a.keys() == b.keys()
        for key in sorted(a):
            if isinstance(a[key], (int, float)) and not isinstance(a[key], bool):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
            else:  # words and lists (kfac.damping_mode, kfac.unpreconditioned_layers): equal
                assert a[key] == b[key], (a["step"], key)


@pytest.mark.slow
def test_pretraining_twice_from_scratch_gives_the_same_metrics(tmp_path: Path) -> None:
    """The main job's own path: the WordPiece vocabulary is trained on the corpus in each run."""
    first, second = _pretrain(tmp_path / "a"), _pretrain(tmp_path / "b")
    assert vocab_digest(tmp_path / "a" / "data" / "vocab.txt") == vocab_digest(tmp_path / "b" / "data" / "vocab.txt"), \
        "the trained WordPiece vocabulary differs between two runs on the same corpus"
    _same_metrics(first, second)


@pytest.mark.slow
@pytest.mark.skipif(not BERT_VOCAB.is_file(), reason=f"{BERT_VOCAB} absent")
def test_with_a_given_vocabulary_everything_after_it_is_deterministic(tmp_path: Path) -> None:
    """The same with a fixed vocab.txt: tells a vocabulary-training difference from one in examples or training."""
    first = _pretrain(tmp_path / "a", "--vocab", str(BERT_VOCAB))
    second = _pretrain(tmp_path / "b", "--vocab", str(BERT_VOCAB))
    _same_metrics(first, second)
