"""Text → documents → sentences (the inputs' formats are read by :mod:`bert_pretrain.data.readers`).

A document is a blank-line-separated block of a file (``split="blocks"``, the format of Google's
create_pretraining_data) or a whole file (``split="files"``). WikiText files are recognised by their
``= Heading =`` lines: there every heading (any level) starts a new document and blank lines only separate
paragraphs, so a document is a section rather than a single paragraph; WikiText's ``@-@``, ``@,@`` and ``@.@``
tokenisation marks are undone. Sentences are split after terminal punctuation followed by a capital or digit.
A row of a JSON Lines / Parquet / datasets input is read like a small text file of its own: a row always ends a
document (with ``split="files"`` a row is one document).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from bert_pretrain.data.errors import DataError
from bert_pretrain.data.readers import Lines, units
from bert_pretrain.data.sources import Source, resolve

HEADING = re.compile(r"^\s*(=+)\s.*\s\1\s*$")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
WIKITEXT_MARKS = re.compile(r" @([-,.])@ ")
SPLITS = ("blocks", "files")


def split_sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(paragraph.strip()) if s.strip()]


def unit_documents(lines: Lines, *, split: str) -> Iterator[list[str]]:
    """The documents of one text unit (a file, or a table row), as lists of sentences. A first pass over the
    lines looks for WikiText headings (stopping at the first), the second splits."""
    wikitext = any(HEADING.match(line) for line in lines())
    current: list[str] = []
    for line in lines():
        heading = wikitext and HEADING.match(line) is not None
        boundary = heading or (not line.strip() and split == "blocks" and not wikitext)
        if boundary:
            if current:
                yield current
            current = []
        elif line.strip():
            current.extend(split_sentences(WIKITEXT_MARKS.sub(r"\1", line) if wikitext else line))
    if current:
        yield current


def iter_documents(sources: list[Source], *, split: str = "blocks", encoding: str = "utf-8") -> Iterator[list[str]]:
    """Documents as lists of sentences from every input (in order), one at a time: the corpus is never held."""
    if split not in SPLITS:
        raise DataError(f"--doc-split {split!r} is not valid; use one of {', '.join(SPLITS)}")
    for source in sources:
        empty = True
        for unit in units(source, encoding=encoding):
            for document in unit_documents(unit, split=split):
                empty = False
                yield document
        if empty:
            raise DataError(f"--data: {source.path} is empty; give a file with text or leave it out")


def read_documents(paths: list[Path], *, split: str = "blocks", encoding: str = "utf-8", text_column: str = "text",
                   data_split: str | None = None) -> list[list[str]]:
    """Every document of ``paths`` in a list (for small inputs and tests; preparation streams
    :func:`iter_documents`)."""
    if split not in SPLITS:
        raise DataError(f"--doc-split {split!r} is not valid; use one of {', '.join(SPLITS)}")
    sources = resolve(paths, text_column=text_column, data_split=data_split)
    return list(iter_documents(sources, split=split, encoding=encoding))
