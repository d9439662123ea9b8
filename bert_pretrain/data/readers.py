"""Streaming readers of the ``--data`` formats: each input as *text units* (a text file, or one row's text of a
table), every unit given as a function that opens its lines afresh.

Nothing reads a whole file: text is decoded in 1 MiB blocks (an incremental decoder, so a multi-byte character
split between blocks is fine), JSON Lines line by line, Parquet and datasets folders in record batches of the
text column only (datasets folders are memory-mapped Arrow). A unit can be read twice (WikiText detection looks
at a file's lines before splitting it), which costs a second pass over a text file but no memory.
Every failure names the file (and the line or row) and what to do.
"""

from __future__ import annotations

import codecs
import gzip
import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from bert_pretrain.data.errors import DataError
from bert_pretrain.data.sources import Kind, Source, open_dataset

CHUNK = 1 << 20  # bytes per read; the binary (NUL) check looks at the first block, as it always has
ROW_BATCH = 1024  # rows per Parquet / datasets record batch
Lines = Callable[[], Iterable[str]]  # a text unit: opens and yields its lines (without line breaks)


@contextmanager
def _guarded(path: Path, compressed: bool) -> Iterator[None]:
    """Turn a damaged gzip stream into a DataError naming the file."""
    try:
        yield
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        if not compressed:
            raise
        raise DataError(f"--data: {path} is not a readable gzip file ({exc or type(exc).__name__}); re-download "
                        "or re-compress it (gzip -t checks it)") from exc


def _open(path: Path, compressed: bool) -> BinaryIO:
    return gzip.open(path, "rb") if compressed else path.open("rb")  # type: ignore[return-value]


def _blocks(path: Path, compressed: bool) -> Iterator[bytes]:
    with _open(path, compressed) as fh, _guarded(path, compressed):
        while block := fh.read(CHUNK):
            yield block


def _decoder(encoding: str) -> codecs.IncrementalDecoder:
    try:
        return codecs.getincrementaldecoder(encoding)()
    except LookupError as exc:
        raise DataError(f"--encoding {encoding}: unknown encoding; use a Python codec name such as utf-8 or "
                        "latin-1") from exc


def _not_encoded(path: Path, encoding: str, byte: int, offset: int) -> DataError:
    return DataError(f"--data: {path} is not valid {encoding} (byte 0x{byte:02x} at offset {offset}); convert it to "
                     "UTF-8, or name its encoding with --encoding (e.g. latin-1)")


def text_lines(path: Path, *, compressed: bool = False, encoding: str = "utf-8") -> Iterator[str]:
    """The lines of a text file (as ``str.splitlines``), decoded block by block; an error naming the file when
    it is binary or not in ``encoding`` (a lenient decode would silently turn every accented letter of a
    Latin-1 file into U+FFFD, and then [UNK])."""
    decoder, offset, rest = _decoder(encoding), 0, ""
    for block in _blocks(path, compressed):
        if offset == 0 and b"\0" in block:
            raise DataError(f"--data: {path} looks binary (it has NUL bytes); give plain text files")
        try:
            text = decoder.decode(block)
        except UnicodeDecodeError as exc:  # exc.object: the bytes held back from the last block, then this one
            raise _not_encoded(path, encoding, exc.object[exc.start],
                               offset - (len(exc.object) - len(block)) + exc.start) from exc
        offset += len(block)
        pieces = (rest + text).splitlines(keepends=True)
        rest = pieces.pop() if pieces else ""  # may continue in the next block (or be '\r' of a '\r\n')
        for piece in pieces:
            yield piece.splitlines()[0]
    try:
        rest += decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise _not_encoded(path, encoding, exc.object[exc.start], offset - len(exc.object) + exc.start) from exc
    yield from rest.splitlines()


def _jsonl_texts(source: Path, *, column: str, compressed: bool, encoding: str) -> Iterator[str | None]:
    with _open(source, compressed) as fh, _guarded(source, compressed):
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode(encoding))
            except UnicodeDecodeError as exc:
                raise DataError(f"--data: {source} line {number} is not valid {encoding}; convert it to UTF-8, or "
                                "name its encoding with --encoding") from exc
            except ValueError as exc:
                raise DataError(f"--data: {source} line {number} is not valid JSON ({exc}); a .jsonl file holds one "
                                'JSON object per line, e.g. {"text": "..."}') from exc
            if not isinstance(record, dict):
                raise DataError(f"--data: {source} line {number} is a JSON {type(record).__name__}, not an object; a "
                                '.jsonl file holds one JSON object per line, e.g. {"text": "..."}')
            if column not in record:
                raise DataError(f"--data: {source} line {number} has no column {column!r}; its columns are "
                                f"{', '.join(record) or '(none)'}: name the text column with --text-column")
            yield record[column]


def _parquet_texts(source: Path, *, column: str) -> Iterator[str | None]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        for batch in pq.ParquetFile(source).iter_batches(batch_size=ROW_BATCH, columns=[column]):
            yield from batch.column(0).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"--data: {source} is not a readable Parquet file ({exc})") from exc


def _dataset_texts(source: Source) -> Iterator[str | None]:
    dataset = open_dataset(source)
    if source.split is not None:
        dataset = dataset[source.split]
    for batch in dataset.select_columns([source.column]).iter(batch_size=ROW_BATCH):
        yield from batch[source.column]


def _records(source: Source, *, encoding: str) -> Iterator[str | None]:
    assert source.column is not None
    if source.kind == Kind.JSONL:
        compressed = source.path.suffix.lower() == ".gz"
        return _jsonl_texts(source.path, column=source.column, compressed=compressed, encoding=encoding)
    if source.kind == Kind.PARQUET:
        return _parquet_texts(source.path, column=source.column)
    return _dataset_texts(source)


def units(source: Source, *, encoding: str = "utf-8") -> Iterator[Lines]:
    """The text units of one input, lazily: the file itself, or each row's text (empty or null rows skipped)."""
    if not source.records:
        compressed = source.kind == Kind.GZIP
        yield lambda: text_lines(source.path, compressed=compressed, encoding=encoding)
        return
    where = f"{source.path}{f' (split {source.split})' if source.split else ''}"
    for row, text in enumerate(_records(source, encoding=encoding)):
        if text is None:
            continue
        if not isinstance(text, str):
            raise DataError(f"--data: {where} row {row}: column {source.column!r} holds {type(text).__name__}, not "
                            "text; name the text column with --text-column")
        lines = text.splitlines()
        yield lambda lines=lines: lines  # type: ignore[misc]
