"""The WordPiece tokenizer: a given BERT vocab.txt, or one trained on the corpus with ``tokenizers``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bert_pretrain.data.documents import DataError

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def check_vocab(path: Path) -> None:
    if not path.is_file():
        raise DataError(f"--vocab: {path} does not exist")
    tokens = set(path.read_text(encoding="utf-8").split("\n"))
    missing = [t for t in SPECIAL if t not in tokens]
    if missing:
        raise DataError(f"--vocab: {path} lacks the special token(s) {missing}; a BERT vocab.txt needs "
                        f"{', '.join(SPECIAL)}")


def load_tokenizer(vocab: Path, *, lower_case: bool = True) -> Any:
    """A fast BERT tokenizer from vocab.txt (``vocab=``: transformers 5 ignores ``vocab_file=``)."""
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]

    check_vocab(vocab)
    tok = BertTokenizerFast(vocab=str(vocab), do_lower_case=lower_case)
    lines = sum(1 for _ in vocab.open(encoding="utf-8"))
    if len(tok) < lines - 1:
        raise DataError(f"--vocab: {vocab} has {lines} lines but the tokenizer loaded {len(tok)} tokens")
    return tok


def train_vocab(documents: list[list[str]], out_dir: Path, *, vocab_size: int = 8000,
                lower_case: bool = True) -> Path:
    """Train a WordPiece vocabulary on the corpus and write ``out_dir/vocab.txt``."""
    from tokenizers import BertWordPieceTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    trainer = BertWordPieceTokenizer(lowercase=lower_case)
    sentences = (s for doc in documents for s in doc)
    trainer.train_from_iterator(sentences, vocab_size=vocab_size, special_tokens=SPECIAL, min_frequency=2,
                                show_progress=False)
    trainer.save_model(str(out_dir))
    return out_dir / "vocab.txt"
