"""Raw text files → documents → sentences.

A document is a blank-line-separated block of a file (``split="blocks"``, the format of Google's
create_pretraining_data) or a whole file (``split="files"``). WikiText files are recognised by their
``= Heading =`` lines: there every heading (any level) starts a new document and blank lines only separate
paragraphs, so a document is a section rather than a single paragraph; WikiText's ``@-@``, ``@,@`` and ``@.@``
tokenisation marks are undone. Sentences are split after terminal punctuation followed by a capital or digit.
"""

from __future__ import annotations

import re
from pathlib import Path

HEADING = re.compile(r"^\s*(=+)\s.*\s\1\s*$")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
WIKITEXT_MARKS = re.compile(r" @([-,.])@ ")
SPLITS = ("blocks", "files")


class DataError(ValueError):
    """Bad input data; the message names the file or flag and the fix."""


def split_sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(paragraph.strip()) if s.strip()]


def _file_documents(lines: list[str], *, split: str) -> list[list[str]]:
    wikitext = any(HEADING.match(line) for line in lines)
    docs: list[list[str]] = []
    current: list[str] = []
    for line in lines:
        heading = wikitext and HEADING.match(line) is not None
        boundary = heading or (not line.strip() and split == "blocks" and not wikitext)
        if boundary:
            if current:
                docs.append(current)
            current = []
        elif line.strip():
            current.extend(split_sentences(WIKITEXT_MARKS.sub(r"\1", line) if wikitext else line))
    if current:
        docs.append(current)
    return docs


def decode(path: Path, *, encoding: str = "utf-8", flag: str = "--data") -> str:
    """The file's text; an error naming it when it is binary or not in ``encoding`` (a lenient decode would
    silently turn every accented letter of a Latin-1 file into U+FFFD, and then [UNK])."""
    raw = path.read_bytes()
    if b"\0" in raw[:1 << 20]:
        raise DataError(f"{flag}: {path} looks binary (it has NUL bytes); give plain text files")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise DataError(f"{flag}: {path} is not valid {encoding} (byte 0x{raw[exc.start]:02x} at offset "
                        f"{exc.start}); convert it to UTF-8, or name its encoding with --encoding (e.g. latin-1)"
                        ) from exc
    except LookupError as exc:
        raise DataError(f"--encoding {encoding}: unknown encoding; use a Python codec name such as utf-8 or "
                        "latin-1") from exc


def read_documents(paths: list[Path], *, split: str = "blocks", encoding: str = "utf-8") -> list[list[str]]:
    """Documents as lists of sentences, from every file in ``paths`` (in order)."""
    if split not in SPLITS:
        raise DataError(f"--doc-split {split!r} is not valid; use one of {', '.join(SPLITS)}")
    if not paths:
        raise DataError("no input files: pass --data FILE [FILE ...]")
    docs: list[list[str]] = []
    for path in paths:
        if not path.is_file():
            raise DataError(f"--data: {path} does not exist or is not a file; check the path")
        text = decode(path, encoding=encoding)
        if not text.strip():
            raise DataError(f"--data: {path} is empty; give a file with text or leave it out")
        docs.extend(_file_documents(text.splitlines(), split=split))
    return docs
