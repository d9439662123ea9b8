"""Small SQuAD fixtures for tests/squad_finetune: JSON builders and paths to the shared real data."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
DEV_SUBSET = SHARED_DATA / "squad" / "dev-v1.1-articles-00-39.json"
BERT_VOCAB = SHARED_DATA / "bert-vocab" / "vocab.txt"

requires_dev_subset = pytest.mark.skipif(
    not DEV_SUBSET.is_file(), reason=f"real SQuAD dev subset not found at {DEV_SUBSET} (shared data folder absent)"
)
requires_bert_vocab = pytest.mark.skipif(
    not BERT_VOCAB.is_file(), reason=f"real BERT vocab not found at {BERT_VOCAB} (shared data folder absent)"
)


def paragraph(context: str, qas: list[tuple[str, str, list[str]]]) -> dict[str, Any]:
    """A SQuAD paragraph; each answer's ``answer_start`` is its first occurrence in ``context``."""
    out = []
    for qid, question, answers in qas:
        spans = []
        for text in answers:
            match = re.search(rf"(?<!\w){re.escape(text)}(?!\w)", context)  # a whole-word occurrence
            assert match is not None, f"fixture error: {text!r} not in context"
            start = match.start()
            spans.append({"text": text, "answer_start": start})
        out.append({"id": qid, "question": question, "answers": spans})
    return {"context": context, "qas": out}


def squad_doc(articles: list[list[dict[str, Any]]], *, version: Any = "1.1") -> dict[str, Any]:
    """A SQuAD document from a list of articles, each a list of paragraphs."""
    return {
        "version": version,
        "data": [{"title": f"Article_{i}", "paragraphs": paras} for i, paras in enumerate(articles)],
    }


def write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def small_squad() -> dict[str, Any]:
    """Three articles, five questions, one with several gold answers."""
    return squad_doc([
        [paragraph("Denver Broncos defeated the Carolina Panthers 24-10 to win Super Bowl 50.",
                   [("q1", "Who won Super Bowl 50?", ["Denver Broncos", "Broncos"]),
                    ("q2", "What was the score?", ["24-10"])])],
        [paragraph("The Rhine flows through Basel and reaches the North Sea near Rotterdam.",
                   [("q3", "Where does the Rhine reach the sea?", ["near Rotterdam", "Rotterdam"]),
                    ("q4", "Which city does the Rhine flow through?", ["Basel"])])],
        [paragraph("Oxygen was discovered by Carl Wilhelm Scheele in 1771.",
                   [("q5", "Who discovered oxygen?", ["Carl Wilhelm Scheele", "Scheele"])])],
    ])


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def word_tokenizer(words: list[str]) -> Any:
    """A fast BERT tokenizer whose vocabulary is the special tokens plus ``words``: one token per word. Built by
    bert_pretrain's load_tokenizer, the one place tokenizers are built from a vocabulary (it checks the size)."""
    import tempfile

    from bert_pretrain.data.tokenizer import load_tokenizer

    tokens = list(dict.fromkeys(SPECIAL_TOKENS + [w.lower() for w in words]))
    with tempfile.TemporaryDirectory() as tmp:
        vocab = Path(tmp) / "vocab.txt"
        vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
        return load_tokenizer(vocab)


def numbered_words(n: int, prefix: str = "w") -> list[str]:
    """``w0 .. w{n-1}``: distinct one-token words, handy for counting window positions by hand."""
    return [f"{prefix}{i}" for i in range(n)]


def save_tiny_qa_model(path: Path, tokenizer: Any, *, hidden: int = 64, layers: int = 2, heads: int = 2,
                       max_positions: int = 256, seed: int = 0) -> Path:
    """A randomly initialised tiny ``BertForQuestionAnswering`` + ``tokenizer`` saved as a model directory."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden, max_position_embeddings=max_positions)
    BertForQuestionAnswering(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_untrained_builtin_model(path: Path, *, num_articles: int, seed: int = 0, hidden: int = 128,
                                 layers: int = 2) -> Path:
    """A random tiny QA model whose WordPiece vocab is trained (as bert_pretrain does) on the built-in corpus."""
    from bert_pretrain.corpus import generate_corpus
    from bert_pretrain.data.tokenizer import load_tokenizer, train_vocab

    corpus = generate_corpus(seed=seed, num_articles=num_articles)
    vocab = train_vocab([doc.split("\n") for doc in corpus.documents()], path.parent / f"{path.name}-vocab",
                        vocab_size=2000)
    return save_tiny_qa_model(path, load_tokenizer(vocab), hidden=hidden, layers=layers, heads=max(2, hidden // 32),
                              max_positions=128)
