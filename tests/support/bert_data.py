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


FOREIGN_WORD = "ሰላም"  # Ethiopic: not in the BERT vocabulary, a whole [UNK]


def wikitext_excerpt(path: Path, *, lines: int = 300, foreign_every: int = 0, encoding: str = "utf-8",
                     accented: bool = False) -> Path:
    """The first ``lines`` lines of WikiText-2 valid (several '= Heading =' sections, so several documents) written
    to ``path`` in ``encoding``: every ``foreign_every``-th word replaced by a word the BERT vocabulary lacks (an
    [UNK] share of about 1/``foreign_every``), and with ``accented`` a few accented words (not ASCII, so a latin-1
    file of it is not valid UTF-8)."""
    out = []
    for line in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines()[:lines]:
        words = line.split(" ")
        if foreign_every and not line.lstrip().startswith("="):
            words = [FOREIGN_WORD if i % foreign_every == foreign_every - 1 and w.strip() else w
                     for i, w in enumerate(words)]
        if accented and len(words) > 10:
            words.insert(5, "café à Zürich")
        out.append(" ".join(words))
    path.write_text("\n".join(out) + "\n", encoding=encoding, errors="replace")  # latin-1 lacks some of its marks
    return path
