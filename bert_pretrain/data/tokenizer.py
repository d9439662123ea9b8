"""The WordPiece tokenizer: a given BERT vocab.txt, or one trained on the corpus with ``tokenizers``."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bert_pretrain.data.errors import DataError
from bert_pretrain.files import write_atomic

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def vocab_tokens(path: Path, *, flag: str = "--vocab") -> list[str]:
    """The tokens of a vocab.txt, one per line; an error naming ``flag`` when any BERT special token is missing."""
    if not path.is_file():
        raise DataError(f"{flag}: {path} does not exist; give a BERT vocab.txt or leave {flag} out to train one")
    try:
        tokens = [t for t in path.read_text(encoding="utf-8").splitlines() if t]
    except UnicodeDecodeError as exc:
        raise DataError(f"{flag}: {path} is not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset "
                        f"{exc.start}); give a BERT vocab.txt, one token per line") from exc
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


def train_vocab(documents: Iterable[list[str]], out_dir: Path, *, vocab_size: int = 8000,
                lower_case: bool = True) -> Path:
    """Learn a WordPiece vocabulary on the corpus and write ``out_dir/vocab.txt`` (the same file for the same
    corpus and settings, in any process: see :mod:`bert_pretrain.data.wordpiece` for why not ``tokenizers``)."""
    from bert_pretrain.data.wordpiece import learn_vocab, word_counts

    counts = word_counts((s for doc in documents for s in doc), lower_case=lower_case)
    tokens = learn_vocab(counts, vocab_size=vocab_size, specials=SPECIAL)
    # specials first, then words before continuation pieces, each alphabetically: ids do not follow merge order
    rest = sorted(set(tokens) - set(SPECIAL), key=lambda t: (t.startswith("##"), t))
    path = out_dir / "vocab.txt"
    write_atomic(path, ("\n".join(SPECIAL + rest) + "\n").encode("utf-8"))
    return path
