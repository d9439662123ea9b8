"""The WordPiece tokenizer: a given BERT vocab.txt, or one trained on the corpus with ``tokenizers``."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from bert_pretrain.data.documents import DataError

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def vocab_tokens(path: Path, *, flag: str = "--vocab") -> list[str]:
    """The tokens of a vocab.txt, one per line; an error naming ``flag`` when any BERT special token is missing."""
    if not path.is_file():
        raise DataError(f"{flag}: {path} does not exist; give a BERT vocab.txt or leave {flag} out to train one")
    tokens = [t for t in path.read_text(encoding="utf-8").splitlines() if t]
    missing = [t for t in SPECIAL if t not in tokens]
    if missing:
        raise DataError(f"{flag}: {path} lacks the special token(s) {' '.join(missing)}; a BERT vocab.txt needs "
                        f"{' '.join(SPECIAL)} (one token per line)")
    return tokens


def vocab_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def load_tokenizer(vocab: Path, *, lower_case: bool = True, flag: str = "--vocab") -> Any:
    """A fast BERT tokenizer from vocab.txt (``vocab=``: transformers 5 silently ignores ``vocab_file=``)."""
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]

    tokens = vocab_tokens(vocab, flag=flag)
    tok = BertTokenizerFast(vocab=str(vocab), do_lower_case=lower_case)
    if len(tok) != len(set(tokens)):
        raise DataError(f"{flag}: {vocab} has {len(set(tokens))} distinct tokens but the tokenizer loaded {len(tok)}; "
                        "is it a plain BERT vocab.txt (one token per line)?")
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
    # the trainer's token order depends on hash-map iteration: sort it so the same tokens get the same ids
    path = out_dir / "vocab.txt"
    tokens = [t for t in path.read_text(encoding="utf-8").splitlines() if t]
    rest = sorted(set(tokens) - set(SPECIAL), key=lambda t: (t.startswith("##"), t))
    path.write_text("\n".join(SPECIAL + rest) + "\n", encoding="utf-8")
    return path
