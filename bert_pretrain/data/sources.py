"""What ``--data`` names, resolved into inputs of a known format, and the content fingerprint of each.

Formats (by name): plain text (any file not named below, e.g. ``.txt``, WikiText's ``.tokens``), gzip-compressed
text (``.gz``, e.g. ``.txt.gz``), JSON Lines (``.jsonl``, ``.jsonl.gz``) and Parquet (``.parquet``) with a text
column, a HF ``datasets`` folder written by ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` of which one
split is read), and a folder of such files (its files in name order). Extensions of formats that are *not* read
(``.csv``, ``.json``, ``.zip``, ...) are refused by name rather than read as text.

Checks here are cheap (names, Parquet schemas, dataset metadata), so :mod:`bert_pretrain.preflight` can run them
before any data preparation; reading is in :mod:`bert_pretrain.data.readers`.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from bert_pretrain.data.errors import DataError

logger = logging.getLogger(__name__)
DATASET_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes (DatasetDict, Dataset)
REFUSED = (".csv", ".tsv", ".json", ".zip", ".tar", ".tgz", ".bz2", ".xz", ".zst", ".lz4", ".7z", ".arrow",
           ".feather", ".pdf", ".docx", ".xlsx", ".pkl", ".npy", ".pt")
FORMATS = ("plain text (.txt or any other name), gzip-compressed text (.txt.gz), JSON Lines (.jsonl, .jsonl.gz), "
           "Parquet (.parquet), a HF datasets folder (save_to_disk), or a folder of such files")


class Kind(str, Enum):
    TEXT = "text"
    GZIP = "gzip"
    JSONL = "jsonl"
    PARQUET = "parquet"
    DATASET = "dataset"


@dataclass(frozen=True)
class Source:
    """One input: its path and format; ``column`` for record formats, ``split`` for a DatasetDict."""

    path: Path
    kind: Kind
    column: str | None = None
    split: str | None = None

    @property
    def records(self) -> bool:
        """Rows of a table (each read like a small text file) rather than one text file."""
        return self.kind in (Kind.JSONL, Kind.PARQUET, Kind.DATASET)


def classify(path: Path) -> Kind:
    """The format of a file from its name; an error naming it for a format that is not read."""
    suffixes = [s.lower() for s in path.suffixes]
    compressed = bool(suffixes) and suffixes[-1] == ".gz"
    inner = suffixes[-2] if compressed and len(suffixes) > 1 else (suffixes[-1] if suffixes and not compressed
                                                                     else "")
    if inner == ".jsonl":
        return Kind.JSONL
    if inner == ".parquet" and not compressed:
        return Kind.PARQUET
    if inner in REFUSED or inner == ".parquet":
        raise DataError(f"--data: {path}: {''.join(suffixes[-2 if compressed else -1:])} files are not read; give "
                        f"{FORMATS}" + (" (a .json file of one object per line: rename it .jsonl)"
                                        if inner == ".json" else ""))
    return Kind.GZIP if compressed else Kind.TEXT


def is_dataset_folder(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in DATASET_MARKERS)


def is_dataset_dict(path: Path) -> bool:
    """A folder written by ``DatasetDict.save_to_disk``: the only input ``--data-split`` chooses in."""
    return path.is_dir() and (path / DATASET_MARKERS[0]).is_file()


def _dataset_source(path: Path, *, column: str, split: str | None) -> Source:
    """A ``save_to_disk`` folder; a DatasetDict reads ``split`` (default ``train``, or its only split)."""
    dataset = open_dataset(Source(path, Kind.DATASET, column, split))
    if isinstance(dataset, dict):  # a DatasetDict (a dict subclass)
        splits = sorted(dataset)
        chosen = split or ("train" if "train" in dataset else splits[0] if len(splits) == 1 else None)
        if chosen not in dataset:
            raise DataError(f"--data: {path} is a DatasetDict with the splits {', '.join(splits) or '(none)'}; "
                            f"{'--data-split ' + split + ' is not one of them' if split else 'none is train'}: "
                            "choose one with --data-split")
        logger.info("--data %s: reading split %r of %s (--data-split chooses another)", path, chosen,
                    ", ".join(splits))
        split, dataset = chosen, dataset[chosen]
    else:
        split = None  # a plain Dataset has no splits: --data-split is for the DatasetDicts beside it
    names = list(dataset.column_names)
    if column not in names:
        raise DataError(f"--data: {path}{f' (split {split})' if split else ''} has no column {column!r}; its "
                        f"columns are {', '.join(names)}: name the text column with --text-column")
    if len(dataset) == 0:
        raise DataError(f"--data: {path}{f' (split {split})' if split else ''} holds no rows; give a dataset "
                        "with text")
    return Source(path, Kind.DATASET, column, split)


def open_dataset(source: Source) -> Any:
    """``datasets.load_from_disk`` (memory-mapped: nothing is read into memory), errors naming the folder."""
    from datasets import load_from_disk

    try:
        return load_from_disk(str(source.path))
    except IndexError as exc:  # datasets 5.2 fails so on a folder saved from an empty Dataset (no Arrow files)
        raise DataError(f"--data: {source.path} holds no rows (a datasets folder without Arrow files); give a "
                        "dataset with text") from exc
    except (OSError, ValueError) as exc:
        raise DataError(f"--data: {source.path} is not a readable HF datasets folder ({exc}); give a folder "
                        "written by Dataset.save_to_disk or DatasetDict.save_to_disk") from exc


def _parquet_source(path: Path, *, column: str) -> Source:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"--data: {path} is not a readable Parquet file ({exc})") from exc
    if column not in names:
        raise DataError(f"--data: {path} has no column {column!r}; its columns are {', '.join(names)}: name the "
                        "text column with --text-column")
    return Source(path, Kind.PARQUET, column)


def _file_source(path: Path, *, column: str) -> Source:
    kind = classify(path)
    if kind == Kind.PARQUET:
        return _parquet_source(path, column=column)
    return Source(path, kind, column if kind == Kind.JSONL else None)


def resolve(paths: list[Path], *, text_column: str = "text", data_split: str | None = None) -> list[Source]:
    """The inputs that ``--data PATH ...`` names, in order; a folder that is no datasets folder gives its files."""
    if not paths:
        raise DataError("no input files: pass --data FILE [FILE ...]")
    out: list[Source] = []
    for path in paths:
        if is_dataset_folder(path):
            out.append(_dataset_source(path, column=text_column, split=data_split))
        elif path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            if not files:
                raise DataError(f"--data: {path} is an empty folder: no datasets files ({', '.join(DATASET_MARKERS)}"
                                f" from save_to_disk) and no text files; give {FORMATS}")
            out.extend(_file_source(p, column=text_column) for p in files)
        elif path.is_file():
            out.append(_file_source(path, column=text_column))
        else:
            raise DataError(f"--data: {path} does not exist or is not a file; check the path")
    return out


def _digest(files: list[Path]) -> str:
    """sha256 of the files' content (prefix), read in 1 MiB blocks: what the data *is*, whatever its path or
    modification time."""
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def data_files(source: Source) -> list[Path]:
    """The files whose bytes are the input: the file itself, or the chosen split's Arrow files."""
    if source.kind != Kind.DATASET:
        return [source.path]
    dataset = open_dataset(source)
    if source.split is not None:
        dataset = dataset[source.split]
    return [Path(f["filename"]) for f in dataset.cache_files]


def fingerprint(sources: list[Source]) -> list[list[Any]]:
    """Name, size and content digest of each input (plus the column and split read from a table), so that any
    change of what is read prepares the data again. A plain or gzip text file's entry is ``[name, size,
    digest]``, as it has always been: data prepared before these formats existed is reused."""
    out: list[list[Any]] = []
    for source in sources:
        files = data_files(source)
        entry: list[Any] = [source.path.name, sum(f.stat().st_size for f in files), _digest(files)]
        if source.records:
            entry.append({"text_column": source.column, **({"split": source.split} if source.split else {})})
        out.append(entry)
    return out
