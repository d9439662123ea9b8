"""Tokenised documents on disk: written chunk by chunk to an Arrow file, read back memory-mapped.

Example creation needs random access to every document of its pool (a random next segment comes from any other
document), so the tokenised corpus must be addressable as a whole; keeping it as Python lists cost far more
memory than the text itself. Here it lives in one Arrow file (``doc``: int64, ``sentences``: list of int32 token
lists) that ``datasets`` memory-maps: the pages are the operating system's file cache, not the process's heap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

TOKENIZE_CHUNK = 20_000  # sentences per tokenizer call and per record batch written
INDEX_CHUNK = 1 << 16  # document numbers per record batch of a row file


@dataclass
class TokenCounts:
    """What tokenisation saw: the documents kept, their tokens, and how many of those are [UNK]."""

    documents: int = 0
    tokens: int = 0
    unknown: int = 0


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([("doc", pa.int64()), ("sentences", pa.list_(pa.list_(pa.int32())))])


def tokenize_to_file(docs: Iterable[list[str]], tok: Any, path: Path) -> TokenCounts:
    """Documents of sentences → ``path``, documents of token-id lists numbered from 0; empty sentences and
    documents are dropped. Holds one chunk of sentences at a time."""
    import pyarrow as pa

    counts, schema = TokenCounts(), _schema()
    pending: list[list[str]] = []
    waiting = 0

    def flush(writer: Any) -> None:
        sentences = [s for d in pending for s in d]
        ids = tok(sentences, add_special_tokens=False)["input_ids"] if sentences else []
        kept, pos = [], 0
        for d in pending:
            document = [x for x in ids[pos:pos + len(d)] if x]
            pos += len(d)
            if document:
                kept.append(document)
        counts.tokens += sum(len(s) for d in kept for s in d)
        counts.unknown += sum(s.count(tok.unk_token_id) for d in kept for s in d)
        numbers = pa.array(range(counts.documents, counts.documents + len(kept)), pa.int64())
        writer.write_batch(pa.record_batch([numbers, pa.array(kept, schema.field("sentences").type)], schema=schema))
        counts.documents += len(kept)

    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for document in tqdm(docs, desc="tokenising", unit=" documents", mininterval=2):
            pending.append(document)
            waiting += len(document)
            if waiting >= TOKENIZE_CHUNK:
                flush(writer)
                pending, waiting = [], 0
        flush(writer)
    return counts


def open_documents(path: Path) -> Any:
    """The tokenised documents as a memory-mapped ``datasets.Dataset``."""
    from datasets import Dataset

    return Dataset.from_file(str(path))


class DocumentTable:
    """``docs[i]``: document ``i``'s sentences as token-id lists, read from the memory-mapped file on demand
    (pickles as a path, so ``datasets.map`` workers share the file rather than copies of the corpus)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> list[list[int]]:
        return list(self.dataset[int(index)]["sentences"])

    def many(self, indices: Sequence[int]) -> list[list[list[int]]]:
        """The sentences of several documents, in the order asked, in one read of exactly those rows."""
        return list(self.dataset[[int(i) for i in indices]]["sentences"])


class IndexFile:
    """Document numbers in a ``.npy`` file, memory-mapped on first use.

    It pickles as its path, so ``datasets.map`` workers share the file's pages (the page cache) instead of each
    holding a copy: an in-memory pool of document numbers costs 8 bytes a document in every process, about 18 MB
    each at 1 GB of text."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._array: Any = None

    @classmethod
    def write(cls, path: Path, indices: Sequence[int]) -> IndexFile:
        import numpy as np

        np.save(path, np.asarray(indices, dtype=np.int64))
        return cls(path)

    def _mapped(self) -> Any:
        if self._array is None:
            import numpy as np

            self._array = np.load(self.path, mmap_mode="r")
        return self._array

    def __len__(self) -> int:
        return len(self._mapped())

    def __getitem__(self, index: int) -> int:
        return int(self._mapped()[index])

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self._array = state["path"], None


def write_rows(path: Path, indices: Sequence[int], *, copies: int) -> Any:
    """A memory-mapped dataset with one column, ``doc``: ``indices`` repeated ``copies`` times, written in chunks.

    It is what example creation maps over. ``Dataset.select`` + ``concatenate_datasets`` did the same in memory:
    the selection goes through a Python list of the indices (about 40 bytes a document, transient, in the process
    that forks the map workers) and keeps an in-memory indices table that is pickled to every worker."""
    import numpy as np
    import pyarrow as pa

    numbers = np.asarray(indices, dtype=np.int64)
    schema = pa.schema([("doc", pa.int64())])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for _ in range(copies):
            for start in range(0, len(numbers), INDEX_CHUNK):
                writer.write_batch(pa.record_batch([pa.array(numbers[start:start + INDEX_CHUNK])], schema=schema))
    return open_documents(path)
