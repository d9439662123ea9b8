"""Pretraining fixtures: the built-in corpus as a text file, the shared real data, and a small prepared phase."""

from __future__ import annotations

from pathlib import Path

from bert_pretrain.corpus import generate_corpus

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
WIKITEXT_VALID = SHARED / "wikitext-2" / "valid.txt"
BERT_VOCAB = SHARED / "bert-vocab" / "vocab.txt"
SHARED_ABSENT = f"real data absent: {WIKITEXT_VALID} and {BERT_VOCAB} are needed (../shared/data from the repo root)"


def corpus_file(folder: Path, *, articles: int = 120, seed: int = 0, name: str = "corpus.txt") -> Path:
    """The built-in generated corpus written as raw pretraining text."""
    return generate_corpus(seed=seed, num_articles=articles).write_text(folder / name)


def real_data_present() -> bool:
    return WIKITEXT_VALID.is_file() and BERT_VOCAB.is_file()
