"""--data formats: .txt.gz, .jsonl, .parquet, datasets folders (Dataset and DatasetDict) and folders of files
read to the same documents as the plain text; columns, splits and their fingerprints; lazy reading."""

from __future__ import annotations

import gzip
import hashlib
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from bert_pretrain.data import readers
from bert_pretrain.data.documents import DataError, iter_documents, read_documents
from bert_pretrain.data.prepare import input_fingerprint
from bert_pretrain.data.sources import resolve
from tests.support.bert_data import corpus_file


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus_file(tmp_path_factory.mktemp("sources"), articles=12)


def _blocks(text: Path) -> list[str]:
    return [b for b in text.read_text().split("\n\n") if b.strip()]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parquet(path: Path, columns: dict[str, list[Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


def _dataset(path: Path, columns: dict[str, list[Any]], *, splits: tuple[str, ...] = ()) -> Path:
    from datasets import Dataset, DatasetDict

    data = Dataset.from_dict(columns)
    if splits:
        DatasetDict({s: data.select(range(i, len(data))) for i, s in enumerate(splits)}).save_to_disk(str(path))
    else:
        data.save_to_disk(str(path))
    return path


def test_every_format_reads_to_the_documents_of_the_plain_text(text: Path, tmp_path: Path) -> None:
    expected = read_documents([text])
    blocks = _blocks(text)
    gz = tmp_path / "corpus.txt.gz"
    gz.write_bytes(gzip.compress(text.read_bytes()))
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "b.txt.gz").write_bytes(gzip.compress(("\n\n".join(blocks[6:]) + "\n").encode()))
    (folder / "a.txt").write_text("\n\n".join(blocks[:6]) + "\n")
    inputs = {
        "gzip": [gz],
        "jsonl": [_jsonl(tmp_path / "c.jsonl", [{"id": i, "body": b} for i, b in enumerate(blocks)])],
        "parquet": [_parquet(tmp_path / "c.parquet", {"body": blocks})],
        "dataset": [_dataset(tmp_path / "ds", {"body": blocks})],
        "folder": [folder],  # its files in name order: a.txt, then b.txt.gz
    }
    for name, paths in inputs.items():
        assert read_documents(paths, text_column="body") == expected, name
    # a row is read like a small file: --doc-split files makes each row one document
    rows = read_documents(inputs["jsonl"], split="files", text_column="body")
    assert len(rows) == len(blocks) and rows == expected


def test_a_datasetdict_reads_train_or_the_chosen_split(text: Path, tmp_path: Path) -> None:
    blocks = _blocks(text)
    folder = _dataset(tmp_path / "dd", {"text": blocks}, splits=("train", "test"))
    assert len(read_documents([folder])) == len(blocks)  # train: every row
    assert len(read_documents([folder], data_split="test")) == len(blocks) - 1
    with pytest.raises(DataError, match=r"dd is a DatasetDict with the splits test, train; --data-split dev is not"):
        read_documents([folder], data_split="dev")
    only = _dataset(tmp_path / "only", {"text": blocks}, splits=("validation",))
    assert len(read_documents([only])) == len(blocks)  # its only split
    two = _dataset(tmp_path / "two", {"text": blocks}, splits=("a", "b"))
    with pytest.raises(DataError, match="none is train: choose one with --data-split"):
        resolve([two])
    # --data-split chooses in the DatasetDicts; a plain Dataset beside them is read whole (it was indexed by the
    # split's name as if it were a column: ValueError "Column 'test' doesn't exist")
    plain = _dataset(tmp_path / "plain", {"text": blocks})
    assert len(read_documents([plain, folder], data_split="test")) == 2 * len(blocks) - 1


def test_a_missing_column_names_the_file_and_its_columns(tmp_path: Path) -> None:
    jsonl = _jsonl(tmp_path / "c.jsonl", [{"id": 1, "content": "A. B."}])
    with pytest.raises(DataError, match=r"c\.jsonl line 1 has no column 'text'; its columns are id, content"):
        read_documents([jsonl])
    parquet = _parquet(tmp_path / "c.parquet", {"id": [1], "content": ["A. B."]})
    with pytest.raises(DataError, match=r"c\.parquet has no column 'text'; its columns are id, content"):
        resolve([parquet])
    dataset = _dataset(tmp_path / "ds", {"id": [1], "content": ["A. B."]})
    with pytest.raises(DataError, match=r"ds has no column 'text'; its columns are id, content.*--text-column"):
        resolve([dataset])
    numbers = _jsonl(tmp_path / "n.jsonl", [{"text": 5}])
    with pytest.raises(DataError, match=r"n\.jsonl row 0: column 'text' holds int, not text"):
        read_documents([numbers])


def test_fingerprints_follow_content_column_split_and_keep_plain_text_entries(text: Path, tmp_path: Path) -> None:
    digest = hashlib.sha256(text.read_bytes()).hexdigest()[:16]
    assert input_fingerprint([text]) == [[text.name, text.stat().st_size, digest]]  # as before these formats
    table = _parquet(tmp_path / "t.parquet", {"text": ["One. Two."], "other": ["Three."]})
    by_column = input_fingerprint([table]), input_fingerprint([table], text_column="other")
    assert by_column[0][0][:3] == by_column[1][0][:3] and by_column[0] != by_column[1]
    folder = _dataset(tmp_path / "dd", {"text": ["One. Two.", "Three. Four."]}, splits=("train", "test"))
    by_split = input_fingerprint([folder]), input_fingerprint([folder], data_split="test")
    assert by_split[0][0][3] == {"text_column": "text", "split": "train"} and by_split[0] != by_split[1]
    before = input_fingerprint([folder])
    _dataset(folder, {"text": ["One. Two.", "Three. Five."]}, splits=("train", "test"))
    assert input_fingerprint([folder]) != before  # the split's Arrow content changed


def test_bad_files_name_themselves(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "Fine. Yes."}\n{"text": "broken\n')
    with pytest.raises(DataError, match=r"bad\.jsonl line 2 is not valid JSON"):
        read_documents([bad_json])
    gz = tmp_path / "cut.txt.gz"
    gz.write_bytes(gzip.compress(b"Some text. More text.\n" * 5000)[:-200])
    with pytest.raises(DataError, match=r"cut\.txt\.gz is not a readable gzip file"):
        read_documents([gz])
    csv = tmp_path / "c.csv"
    csv.write_text("text\nA.\n")
    with pytest.raises(DataError, match=r"c\.csv: \.csv files are not read"):
        resolve([csv])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="empty is an empty folder"):
        resolve([empty])
    none = _dataset(tmp_path / "none", {"text": []})
    with pytest.raises(DataError, match="none holds no rows"):
        resolve([none])


class _Spy:
    """A binary file that records the size of every read."""

    def __init__(self, path: Path, sizes: list[int]) -> None:
        self.fh, self.sizes = path.open("rb"), sizes

    def read(self, size: int = -1) -> bytes:
        self.sizes.append(size)
        return self.fh.read(size)

    def __enter__(self) -> _Spy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


def test_text_is_read_in_blocks_and_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader asks for fixed-size blocks, never the whole file, and yields lines before reading on; a line
    split across blocks (even a '\\r\\n' or a multi-byte character) comes out whole."""
    path = tmp_path / "big.txt"
    line = "Größe eins. Zwei\r\n"
    path.write_text(line * 2000, newline="")
    sizes: list[int] = []
    monkeypatch.setattr(readers, "CHUNK", 97)  # blocks end inside lines, '\r\n' pairs and 'ö'
    monkeypatch.setattr(readers, "_open", lambda p, compressed: _Spy(p, sizes))
    lines = readers.text_lines(path)
    assert next(lines) == "Größe eins. Zwei"
    assert len(sizes) == 1  # one block read for the first line
    rest = list(lines)
    assert rest == ["Größe eins. Zwei"] * 1999
    assert set(sizes) == {97} and len(sizes) > path.stat().st_size // 97


def _reading_peak(path: Path) -> tuple[int, int]:
    """(documents, peak bytes allocated while counting them)."""
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_documents(resolve([path])))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return count, peak


def test_documents_stream_in_memory_that_does_not_grow_with_the_file(tmp_path: Path) -> None:
    """Counting the documents of a 4 MB and a 16 MB file allocates about the same few MB (a block or two of
    1 MiB and its lines): no whole-file string or list of documents."""
    block = ("\n\n".join(_blocks(corpus_file(tmp_path, articles=40))) + "\n\n").encode()
    peaks = {}
    for megabytes in (4, 16):
        path = tmp_path / f"{megabytes}.txt"
        with path.open("wb") as fh:
            for _ in range((megabytes << 20) // len(block)):
                fh.write(block)
        count, peaks[megabytes] = _reading_peak(path)
        assert count > 200 * megabytes
    assert peaks[16] < 8 << 20, f"peak {peaks[16] / 2**20:.1f} MB while reading a 16 MB file"
    assert peaks[16] < 1.3 * peaks[4], peaks  # 4x the text, not more memory


@pytest.mark.parametrize("chunk", [7, 8, 1 << 20])
def test_a_decoding_error_gives_the_offset_in_the_file_whatever_the_blocks(tmp_path: Path, chunk: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mixed.txt"
    data = ("é" * 60 + "\n").encode() * 2 + b"abcde" + "é".encode() + b"x\xff\n"  # 'é' at offsets 247-248
    path.write_bytes(data)
    monkeypatch.setattr(readers, "CHUNK", chunk)  # 8: a block ends inside that 'é', held back by the decoder
    where = data.index(b"\xff")
    with pytest.raises(DataError, match=rf"mixed\.txt is not valid utf-8 \(byte 0xff at offset {where}\)"):
        list(readers.text_lines(path))
