"""Prepare a phase's examples once, as HF datasets Arrow shards with a manifest of the settings.

Layout of the data folder (shared by both phases, so they use one vocabulary)::

    vocab.txt, vocab.json          the vocabulary (given or trained) and what it was made from
    phase1/{train,heldout}/        Arrow shards; phase1/manifest.json holds the settings they were made with
    phase2/...

Re-running with the same inputs and settings reuses the shards. Held-out examples come from held-out
*documents*, so evaluation measures text the model has not trained on. Tokenisation runs in the Rust
tokenizer's thread pool, example creation in ``datasets.map(num_proc=all cores)``; both show progress bars.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import random
import shutil
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bert_pretrain.data.documents import iter_documents
from bert_pretrain.data.errors import DataError
from bert_pretrain.data.examples import COLUMNS, ExampleSettings, Specials, batch_examples
from bert_pretrain.data.forked import run_forked
from bert_pretrain.data.sources import fingerprint, resolve
from bert_pretrain.data.token_store import (
    DocumentTable,
    IndexFile,
    TokenCounts,
    open_documents,
    tokenize_to_file,
    write_rows,
)
from bert_pretrain.data.tokenizer import (
    MAX_UNK_RATE,
    check_coverage,
    check_vocab_size,
    load_tokenizer,
    train_vocab,
    vocab_digest,
    vocab_tokens,
)
from kaisa_ds.checkpoint.atomic import write_atomic

logger = logging.getLogger(__name__)
PHASES = {1: (128, 20), 2: (512, 80)}  # max_seq_length, max_predictions_per_seq
ROWS_PER_PROCESS = 1_000  # (document, copy) rows below which a worker process costs more than it saves
BATCH_TOKENS = 1 << 17  # tokens of documents per datasets.map() call of example creation (see map_batch_documents)
CALL_ROWS_MAX = 1 << 20  # map()'s writer_batch_size: far above a call's examples, so each call is one record batch
COVERAGE = "coverage.json"  # in a phase folder: the token and [UNK] counts of its text, for checks and reports




def input_fingerprint(paths: list[Path], *, text_column: str = "text",
                      data_split: str | None = None) -> list[list[Any]]:
    """Name, size and content digest of each input (and the column and split read from tables): rewriting a file
    with the same text (a new mtime) keeps the prepared data and the trained vocabulary; any change of what is
    read prepares them again (:func:`bert_pretrain.data.sources.fingerprint`)."""
    return fingerprint(resolve(paths, text_column=text_column, data_split=data_split))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _trained_vocab_wanted(inputs: list[list[Any]], *, lower_case: bool, vocab_size: int) -> dict[str, Any]:
    return {"source": "trained", "inputs": inputs, "lower_case": lower_case, "vocab_size": vocab_size}


def expected_vocab_digest(out_dir: Path, *, vocab: Path | None, inputs: list[list[Any]], lower_case: bool,
                          vocab_size: int) -> str | None:
    """The digest the data's vocabulary will have: the given file's, or that of a vocabulary already trained
    on these same inputs (None: it must be trained first)."""
    if vocab is not None:
        return vocab_digest(vocab) if vocab.is_file() else None
    path, record = out_dir / "vocab.txt", _read_json(out_dir / "vocab.json")
    wanted = _trained_vocab_wanted(inputs, lower_case=lower_case, vocab_size=vocab_size)
    if path.is_file() and record is not None and {k: record.get(k) for k in wanted} == wanted \
            and record.get("digest") == vocab_digest(path):
        return str(record["digest"])
    return None


def prepare_vocab(docs: Iterable[list[str]], out_dir: Path, *, inputs: list[list[Any]], vocab: Path | None,
                  lower_case: bool, vocab_size: int) -> Path:
    """``out_dir/vocab.txt``: a copy of ``vocab``, or trained on ``docs`` (kept while the inputs are the same;
    ``docs`` is only iterated, once, when a vocabulary is trained)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path, record_path = out_dir / "vocab.txt", out_dir / "vocab.json"
    if vocab is not None:
        load_tokenizer(vocab, lower_case=lower_case)  # validate before copying
        if not path.is_file() or vocab.resolve() != path.resolve():
            shutil.copyfile(vocab, path)
        record: dict[str, Any] = {"source": str(vocab.resolve()), "digest": vocab_digest(path)}
    else:
        if expected_vocab_digest(out_dir, vocab=None, inputs=inputs, lower_case=lower_case,
                                 vocab_size=vocab_size) is not None:
            return path
        logger.info("training a WordPiece vocabulary of up to %d tokens on the corpus", vocab_size)
        train_vocab(docs, out_dir, vocab_size=vocab_size, lower_case=lower_case)
        got = len(vocab_tokens(path))
        if got < vocab_size:
            logger.warning("the corpus gave a vocabulary of %d tokens, fewer than the %d asked for (--vocab-size): "
                           "it has too few distinct words and pieces for more", got, vocab_size)
        record = {**_trained_vocab_wanted(inputs, lower_case=lower_case, vocab_size=vocab_size),
                  "digest": vocab_digest(path)}
    write_atomic(record_path, json.dumps(record, indent=1).encode())
    return path


def check_vocab_coverage(counts: TokenCounts, tok: Any, *, texts: list[Path], vocab: Path | None,
                         max_unk_rate: float) -> None:
    """Refuse a vocabulary far too small for anything, or one that leaves the corpus mostly [UNK]."""
    check_vocab_size(tok, source=_vocab_source(vocab))
    _check_unknown(counts, texts=texts, vocab=vocab, max_unk_rate=max_unk_rate)


def _vocab_source(vocab: Path | None) -> str:
    return f"--vocab {vocab}" if vocab is not None else "the vocabulary trained on --data"


def _check_unknown(counts: TokenCounts, *, texts: list[Path], vocab: Path | None, max_unk_rate: float) -> None:
    if not counts.tokens:
        return  # an empty corpus is refused where documents are counted
    check_coverage(unknown=counts.unknown, total=counts.tokens, data="--data " + " ".join(str(p) for p in texts),
                   source=_vocab_source(vocab), max_unk_rate=max_unk_rate)


def read_coverage(phase_folder: Path) -> dict[str, int] | None:
    """What tokenising the prepared data counted (``COVERAGE``): documents, tokens, [UNK] tokens and the
    vocabulary's size; None for data prepared before it was recorded."""
    record = _read_json(phase_folder / COVERAGE)
    return {k: int(v) for k, v in record.items()} if isinstance(record, dict) else None


def unk_share(coverage: dict[str, int]) -> float:
    return coverage["unknown"] / max(1, coverage["tokens"])


def split_documents(n: int, *, heldout_fraction: float, seed: int) -> tuple[Sequence[int], Sequence[int]]:
    """(training, held-out) document indices, ascending: a seeded choice of about ``heldout_fraction`` of them.
    Arrays of 8-byte integers, not lists of Python ints (36 bytes each: 150 MB for a 1 GB corpus); the same
    shuffle as on a list, so the choice is the one earlier versions made."""
    if n < 3:
        raise DataError(f"--data: the corpus has {n} usable document(s); at least 3 are needed (2 for training, "
                        "as next-sentence prediction pairs text from different documents, and 1 held out). "
                        "Separate documents by blank lines, or pass more files")
    order = array("q", range(n))
    random.Random(seed).shuffle(order)
    held = sorted(order[:min(n - 2, max(1, round(n * heldout_fraction)))])
    train, k = array("q"), 0
    for start in range(0, n, 1 << 16):  # the complement of ``held``, block by block
        block = array("q", range(start, min(n, start + (1 << 16))))
        while k < len(held) and held[k] < start + len(block):
            block[held[k] - start] = -1
            k += 1
        train.extend(i for i in block if i >= 0)
    return train, array("q", held)


def map_batch_documents(counts: TokenCounts) -> int:
    """Documents per ``datasets.map`` call of example creation: about ``BATCH_TOKENS`` tokens of them.

    Each call's examples become one Arrow record batch of map()'s output (``writer_batch_size`` is
    ``CALL_ROWS_MAX``; at datasets' default of 1000 rows a call of ~2,600 examples made three), and every process
    that opens that output holds heap per record batch, however few rows it has: each worker when it finishes, the
    pool's manager and the main process, which also merges and slices them to save them (~14 KB per record batch in
    all, measured). At a fixed 16 documents a call (~33 examples) that was 1.9 MB of memory per MB of text
    (benchmarks/corpus_memory).
    Sized in tokens rather than documents so that one call's examples (~1 KB each while the worker makes them,
    :func:`bert_pretrain.data.examples.batch_examples`) stay a few MB, however long the documents."""
    mean_tokens = counts.tokens / max(1, counts.documents)
    return max(1, round(BATCH_TOKENS / max(1.0, mean_tokens)))


def _features() -> Any:
    from datasets import Features, Sequence, Value

    return Features({k: Value(dtype) if k == "next_sentence_label" else Sequence(Value(dtype))
                     for k, (_, dtype) in COLUMNS.items()})


def prepare_phase(texts: list[Path], out_dir: Path, *, phase: int, vocab: Path | None = None,
                  lower_case: bool = True, dupe_factor: int = 5, seed: int = 12345, heldout_fraction: float = 0.1,
                  max_seq_length: int | None = None, max_predictions: int | None = None, doc_split: str = "blocks",
                  vocab_size: int = 8000, num_proc: int | None = None, encoding: str = "utf-8",
                  max_unk_rate: float = MAX_UNK_RATE, text_column: str = "text",
                  data_split: str | None = None) -> Path:
    """Write ``out_dir/phase<N>/{train,heldout}`` (and ``out_dir/vocab.txt``); return the phase folder.

    ``texts``: any ``--data`` inputs (:mod:`bert_pretrain.data.sources`), read as a stream: the text passes once
    for the vocabulary (when one is trained) and once for tokenisation, written to disk chunk by chunk.
    ``num_proc``: worker processes for example creation (default: all cores, once there is enough work).
    ``max_unk_rate``: refuse a corpus whose tokens are more than this share [UNK] (a vocabulary or encoding that
    does not fit the text would otherwise train on noise)."""
    seq, max_pred = max_seq_length or PHASES[phase][0], max_predictions or PHASES[phase][1]
    if seq < 8 or not 1 <= max_pred <= seq:
        raise DataError(f"--max-seq-length {seq} / --max-predictions {max_pred}: need a length of at least 8 and "
                        "1 <= predictions <= length")
    if dupe_factor < 1:
        raise DataError(f"--dupe-factor {dupe_factor}: must be at least 1")
    settings = ExampleSettings(max_seq_length=seq, max_predictions=max_pred, dupe_factor=dupe_factor, seed=seed)
    sources = resolve(texts, text_column=text_column, data_split=data_split)
    folder, inputs = out_dir / f"phase{phase}", fingerprint(sources)
    manifest = {"inputs": inputs, "encoding": encoding, "doc_split": doc_split, "lower_case": lower_case,
                "settings": asdict(settings),
                "heldout_fraction": heldout_fraction, "vocab_digest": expected_vocab_digest(
                    out_dir, vocab=vocab, inputs=inputs, lower_case=lower_case, vocab_size=vocab_size)}
    old, cached, coverage = _read_json(folder / "manifest.json"), out_dir / "vocab.txt", read_coverage(folder)
    if manifest["vocab_digest"] is not None and old == manifest and cached.is_file() \
            and vocab_digest(cached) == manifest["vocab_digest"] and coverage is not None:
        # max_unk_rate is no setting of the data: a stricter limit applies to reused data too
        _check_unknown(TokenCounts(documents=coverage["documents"], tokens=coverage["tokens"],
                                   unknown=coverage["unknown"]), texts=texts, vocab=vocab, max_unk_rate=max_unk_rate)
        logger.info("reusing the prepared phase-%d data in %s", phase, folder)
        return folder
    vocab_path = prepare_vocab(iter_documents(sources, split=doc_split, encoding=encoding), out_dir, inputs=inputs,
                               vocab=vocab, lower_case=lower_case, vocab_size=vocab_size)
    tok = load_tokenizer(vocab_path, lower_case=lower_case)
    work = out_dir / f".phase{phase}-work"  # the tokenised corpus and map() caches; removed when done
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        _write_examples(iter_documents(sources, split=doc_split, encoding=encoding), folder, work=work, tok=tok,
                        manifest=manifest, vocab_path=vocab_path, texts=texts, vocab=vocab, settings=settings,
                        heldout_fraction=heldout_fraction, max_unk_rate=max_unk_rate, num_proc=num_proc, phase=phase)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_atomic(folder / "manifest.json", json.dumps(manifest, indent=1).encode())  # last: marks them complete
    return folder


def _write_examples(docs: Iterable[list[str]], folder: Path, *, work: Path, tok: Any, manifest: dict[str, Any],
                    vocab_path: Path, texts: list[Path], vocab: Path | None, settings: ExampleSettings,
                    heldout_fraction: float, max_unk_rate: float, num_proc: int | None, phase: int) -> None:
    """Tokenise ``docs`` into ``work``, check them, and write ``folder/{train,heldout}``."""
    counts = run_forked(lambda: tokenize_to_file(docs, tok, work / "docs.arrow"), what="tokenising")
    train_docs, held_docs = split_documents(counts.documents, heldout_fraction=heldout_fraction, seed=settings.seed)
    check_vocab_coverage(counts, tok, texts=texts, vocab=vocab, max_unk_rate=max_unk_rate)
    specials = Specials.of(tok)
    logger.info("phase %d data: %d tokens in %d documents, %.2f%% of them [UNK] with a vocabulary of %d tokens", phase,
                counts.tokens, counts.documents, 100 * counts.unknown / max(1, counts.tokens), len(tok))
    manifest["vocab_digest"] = vocab_digest(vocab_path)
    digest = hashlib.sha256(json.dumps(manifest).encode()).hexdigest()[:16]
    if folder.exists():
        shutil.rmtree(folder)
    documents = open_documents(work / "docs.arrow")
    for part, indices in (("train", train_docs), ("heldout", held_docs)):
        pool = held_docs if part == "heldout" and len(held_docs) > 1 else train_docs
        examples = _part_examples(documents, indices, pool, work=work, name=f"phase {phase} {part}",
                                  cache_key=f"bert-{digest}-{part}", settings=settings, specials=specials,
                                  num_proc=num_proc, batch_documents=map_batch_documents(counts))
        examples.save_to_disk(str(folder / part))
        _check_readable(folder / part)
        logger.info("phase %d %s: %d examples of %d tokens from %d documents", phase, part, len(examples),
                    settings.max_seq_length, len(indices))
    write_atomic(folder / COVERAGE, json.dumps({"documents": counts.documents, "tokens": counts.tokens,
                                                "unknown": counts.unknown, "vocab_size": len(tok)}).encode())


def _part_examples(documents: Any, indices: Sequence[int], pool: Sequence[int], *, work: Path, name: str,
                   cache_key: str, settings: ExampleSettings, specials: Specials, num_proc: int | None,
                   batch_documents: int) -> Any:
    """The examples of the documents ``indices``, ``settings.dupe_factor`` copies with different masks (held-out
    copies too: more, steadier evaluation examples), copy after copy; random next segments come from ``pool``.
    ``datasets.map`` writes them to ``work`` ``batch_documents`` documents at a time
    (:func:`map_batch_documents`), so they are never all in memory; the rows it maps over (document numbers) and
    the pool are files in ``work`` too, memory-mapped by every process (:func:`write_rows`, :class:`IndexFile`)."""
    copies = settings.dupe_factor
    rows = write_rows(work / f"{cache_key}-rows.arrow", indices, copies=copies)
    pool_file = IndexFile.write(work / f"{cache_key}-pool.npy", pool)
    procs = num_proc or max(1, min(os.cpu_count() or 1, len(rows) // ROWS_PER_PROCESS))
    with _frozen_heap():
        return rows.map(batch_examples, batched=True, batch_size=batch_documents, with_indices=True,
                        remove_columns=["doc"], num_proc=procs if procs > 1 else None,
                        writer_batch_size=CALL_ROWS_MAX,
                        features=_features(), desc=f"{name} examples",
                        new_fingerprint=cache_key,  # datasets would hash all documents otherwise
                        cache_file_name=str(work / f"{cache_key}.arrow"),
                        fn_kwargs={"docs": DocumentTable(documents), "pool": pool_file,
                                   "documents_per_copy": len(indices), "settings": settings, "specials": specials})


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Keep the garbage collector of forked ``datasets.map`` workers off the objects they inherit.

    A worker's full collections write to the header of every object it inherited from this process, so the
    pages holding them stop being shared: measured at 20 MB of text, each worker's share of anonymous memory
    (Pss_Anon) rose from 90 to 138 MB without this, this process's from 81 to 96 and the pool manager's from 80
    to 95. ``gc.freeze`` moves the objects that exist now out
    of the collector's reach until the map is done (Python's advice for fork without exec)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _check_readable(folder: Path) -> None:
    """Fail here, not in training, if the shards just written are unreadable."""
    from datasets import load_from_disk

    load_from_disk(str(folder))
