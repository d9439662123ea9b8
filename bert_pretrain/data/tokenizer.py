"""The WordPiece tokenizer: a given BERT vocab.txt, or one trained on the corpus with ``tokenizers``."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bert_pretrain.data.errors import DataError
from kaisa_ds.checkpoint.atomic import write_atomic

logger = logging.getLogger(__name__)

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MIN_VOCAB = 100  # tokens a vocabulary needs at least (BERT's has 30,522; a trained one usually thousands)
MAX_UNK_RATE = 0.2  # share of [UNK] in a tokenized text above which the text and vocabulary do not match
CASED_SHARE = 0.005  # a vocabulary is cased when more than this share of its tokens holds a capital letter


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


def is_cased(tokens: Iterable[str]) -> bool:
    """Whether a vocabulary keeps capitals: bert-base-uncased has 2 capitalised tokens in 30,522 ('ℝ'),
    a cased vocabulary thousands."""
    words = [t for t in tokens if t not in SPECIAL and not t.startswith("[")]
    capitalised = sum(any(c.isupper() for c in t) for t in words)
    return bool(words) and capitalised > CASED_SHARE * len(words)


def check_casing(vocab: Path, tokens: Iterable[str], *, lower_case: bool, flag: str = "--vocab",
                 cased_flag: str = "--cased") -> None:
    """Refuse text cased differently from the vocabulary. Cased text with an uncased vocabulary makes every
    capitalised word [UNK] (14% of WikiText's words), too few to trip the [UNK] check. Lower-cased text with a
    cased vocabulary gives no [UNK] but loses the capitals the vocabulary was made for and never uses its
    capitalised tokens (a fifth of a cased WordPiece vocabulary learnt on WikiText): almost always a forgotten
    ``cased_flag``, so it is refused too."""
    cased = is_cased(tokens)
    if not lower_case and not cased:
        raise DataError(f"{cased_flag} with {flag} {vocab}: that vocabulary is uncased (no capitalised tokens), so "
                        f"every capitalised word would become [UNK]; leave {cased_flag} out, or give a cased vocab.txt")
    if lower_case and cased:
        raise DataError(f"{flag} {vocab} is a cased vocabulary (it has capitalised tokens) but the text would be "
                        f"lower-cased, losing the capitals it was made for and leaving its capitalised tokens unused; "
                        f"pass {cased_flag} to keep capitals, or give an uncased vocab.txt")


def load_tokenizer(vocab: Path, *, lower_case: bool = True, flag: str = "--vocab", check_case: bool = False,
                   cased_flag: str = "--cased") -> Any:
    """A fast BERT tokenizer from vocab.txt: the one place tokenizers are built from a vocabulary.

    ``vocab=``, not ``vocab_file=``: transformers 5 silently ignores ``vocab_file=`` and builds a 5-token
    tokenizer that maps every word to [UNK]. ``check_case``: also refuse casing that does not match the
    vocabulary's (:func:`check_casing`; for vocabularies a user gives, a trained one follows the corpus).
    ``flag`` / ``cased_flag`` name the options in error messages."""
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]

    tokens = vocab_tokens(vocab, flag=flag)
    if check_case:
        check_casing(vocab, tokens, lower_case=lower_case, flag=flag, cased_flag=cased_flag)
    tok = BertTokenizerFast(vocab=str(vocab), do_lower_case=lower_case)
    if len(tok) != len(set(tokens)):
        raise DataError(f"{flag}: {vocab} has {len(set(tokens))} distinct tokens but the tokenizer loaded {len(tok)}; "
                        "is it a plain BERT vocab.txt (one token per line)?")
    return tok


def check_vocab_size(tok: Any, *, source: str) -> None:
    """Refuse a vocabulary far too small for anything (``source`` names it in the message)."""
    if len(tok) < MIN_VOCAB:
        raise DataError(f"{source} has {len(tok)} tokens; at least {MIN_VOCAB} are needed (BERT's has 30,522): give "
                        "a real BERT vocab.txt, or more text to train one on")


def count_unknown(tok: Any, texts: Iterable[str], *, batch: int = 1000) -> tuple[int, int]:
    """(tokens that are [UNK], all tokens) of ``texts`` under ``tok``, tokenised in batches."""
    unknown = total = 0
    chunk: list[str] = []

    def flush() -> None:
        nonlocal unknown, total
        for ids in tok(chunk, add_special_tokens=False)["input_ids"]:
            unknown += ids.count(tok.unk_token_id)
            total += len(ids)
        chunk.clear()

    for text in texts:
        chunk.append(text)
        if len(chunk) >= batch:
            flush()
    if chunk:
        flush()
    return unknown, total


def check_coverage(*, unknown: int, total: int, data: str, source: str, max_unk_rate: float = MAX_UNK_RATE,
                   rate_flag: str = "--max-unk-rate") -> float:
    """The [UNK] share; a DataError naming ``data`` and ``source`` (the vocabulary) when it exceeds
    ``max_unk_rate`` or when the text has no tokens at all."""
    if total == 0:
        raise DataError(f"{data}: no tokens at all with {source}; is the file empty or not text?")
    share = unknown / total
    if share > max_unk_rate:
        raise DataError(f"{data}: {share:.0%} of its {total} tokens are [UNK] with {source} (more than {rate_flag} "
                        f"{max_unk_rate:g}); the text is not what the vocabulary was made for (binary data, another "
                        f"language or encoding, a cased/uncased mismatch?). Check the files and the vocabulary, or "
                        f"raise {rate_flag}")
    return share


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
