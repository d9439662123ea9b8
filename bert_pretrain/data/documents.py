"""Raw text files → documents → sentences.

A document is a blank-line-separated block, or a whole file when it has no blank lines; WikiText's
``= Heading =`` lines (any level) start a new document. Sentences are split on terminal punctuation.
"""

from __future__ import annotations

import re
from pathlib import Path

HEADING = re.compile(r"^\s*(=+)\s.*\s\1\s*$")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")


class DataError(ValueError):
    """Bad input data; the message names the file or flag and the fix."""


def split_sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(paragraph.strip()) if s.strip()]


def read_documents(paths: list[Path]) -> list[list[str]]:
    """Documents as lists of sentences, from every file in ``paths``."""
    if not paths:
        raise DataError("no input files: pass --data FILE [FILE ...]")
    docs: list[list[str]] = []
    for path in paths:
        if not path.is_file():
            raise DataError(f"--data: {path} does not exist or is not a file")
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            raise DataError(f"--data: {path} is empty; give a file with text")
        current: list[str] = []
        for line in text.splitlines():
            if HEADING.match(line) or not line.strip():
                if current:
                    docs.append(current)
                current = []
                continue
            current.extend(split_sentences(line))
        if current:
            docs.append(current)
    return [d for d in docs if d]
