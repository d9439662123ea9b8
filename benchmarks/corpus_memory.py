"""Peak memory of bert_pretrain's data preparation against the size of the corpus (issue 12: large inputs stream).

For each size, a text file of that many MB is generated (the built-in encyclopedia, 32 seeds of ~1 MB cycled: the
same kind of text as the pipeline's own data), and ``prepare_phase`` (WordPiece vocabulary training, tokenisation,
example creation, Arrow shards) runs on it in a fresh process, the sizes one after another in one run. A sampler
reads ``/proc/<pid>/smaps_rollup`` of that process and its ``datasets.map`` workers every 50 ms and keeps the peak
of the sum of their proportional resident memory (``Pss``: a page shared by forked workers counts once), split
into anonymous memory (``Pss_Anon``: heaps, what the program holds) and file pages (``Pss_File``: the
memory-mapped Arrow files, i.e. the tokenised corpus and the examples being written, which are the kernel's page
cache and dropped under memory pressure). The anonymous peak is the figure that must stay flat;
``main_peak_rss_mb`` is the main process's ``VmHWM`` (both kinds, as ``top`` shows it).

The answer is the growth: (peak at the largest size - peak at the smallest) / (difference of the sizes).
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.memory import MB, peak_rss_bytes
from benchmarks.harness.output import publish, table

SEEDS = 32  # distinct ~1 MB corpora cycled to make a file of any size
ARTICLES = 2000  # articles per seed (~0.95 MB of text)


def generate_text(path: Path, *, megabytes: float) -> Path:
    """A text file of about ``megabytes`` MB of blank-line-separated documents, written piece by piece."""
    from bert_pretrain.corpus import generate_corpus

    target, written, seed = int(megabytes * MB), 0, 0
    pieces: dict[int, bytes] = {}
    with path.open("wb") as fh:
        while written < target:
            if seed % SEEDS not in pieces:
                pieces[seed % SEEDS] = ("\n\n".join(generate_corpus(seed=seed % SEEDS, num_articles=ARTICLES)
                                                    .documents()) + "\n\n").encode()
            piece = pieces[seed % SEEDS][:target - written]
            fh.write(piece)
            written += len(piece)
            seed += 1
    return path


def _status(pid: int) -> dict[str, int]:
    """Pss, Pss_Anon and Pss_File of a process in bytes (empty once it is gone). Proportional figures: pages
    shared between the main process and its forked map() workers count once in the sum over the tree."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("Pss", "Pss_Anon", "Pss_File"):
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return {}
    return out


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (datasets.map workers)."""
    import psutil

    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def _prepare(text: str, out: str, vocab: str | None, dupe_factor: int, queue: Any) -> None:
    import logging

    from bert_pretrain.data.loader import load_split
    from bert_pretrain.data.prepare import prepare_phase

    logging.basicConfig(level=logging.WARNING)
    folder = prepare_phase([Path(text)], Path(out), phase=1, vocab=Path(vocab) if vocab else None,
                           dupe_factor=dupe_factor, seed=0)
    queue.put({"examples": sum(len(load_split(folder, p)) for p in ("train", "heldout")),
               "main_peak_rss_mb": peak_rss_bytes() / MB})


def measure(text: Path, work: Path, *, vocab: Path | None, dupe_factor: int, interval: float = 0.05) -> dict[str, Any]:
    """Prepare ``text`` in a fresh process; its peak memory (process tree) and what it made."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_prepare, args=(str(text), str(work), str(vocab) if vocab else None, dupe_factor, queue))
    start = time.perf_counter()
    proc.start()
    assert proc.pid is not None
    peaks = {"Pss": 0, "Pss_Anon": 0, "Pss_File": 0}
    while proc.is_alive():
        stats = [_status(pid) for pid in _tree(proc.pid)]
        for key in peaks:
            peaks[key] = max(peaks[key], sum(s.get(key, 0) for s in stats))
        time.sleep(interval)
    seconds = time.perf_counter() - start
    if proc.exitcode != 0:
        raise RuntimeError(f"preparing {text} failed with exit code {proc.exitcode}")
    made = queue.get(timeout=60)
    shards = sum(f.stat().st_size for f in (work / "phase1").rglob("*.arrow"))
    return {"input_mb": text.stat().st_size / MB, "seconds": seconds, "peak_pss_mb": peaks["Pss"] / MB,
            "peak_anon_mb": peaks["Pss_Anon"] / MB, "peak_file_mb": peaks["Pss_File"] / MB, **made,
            "examples_on_disk_mb": shards / MB}


def run(sizes_mb: list[float], *, vocab: Path | None = None, dupe_factor: int = 1,
        workdir: Path | None = None) -> dict[str, Any]:
    """Every size one after another in this run; the growth of the peaks between the smallest and largest."""
    rows = []
    root = Path(tempfile.mkdtemp(prefix="corpus-memory-", dir=workdir))
    try:
        for size in sizes_mb:
            text = generate_text(root / f"corpus_{size:g}mb.txt", megabytes=size)
            rows.append(measure(text, root / f"data_{size:g}mb", vocab=vocab, dupe_factor=dupe_factor))
            print(f"measured: {rows[-1]}", flush=True)
            shutil.rmtree(root / f"data_{size:g}mb")
            text.unlink()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first, last = rows[0], rows[-1]
    span = last["input_mb"] - first["input_mb"]
    growth = {key: (last[key] - first[key]) / span if span else None
              for key in ("peak_pss_mb", "peak_anon_mb", "peak_file_mb", "main_peak_rss_mb")}
    return {"settings": {"sizes_mb": sizes_mb, "vocab": str(vocab) if vocab else "trained", "dupe_factor": dupe_factor,
                         "phase": 1},
            "rows": rows, "growth_per_input_mb": growth, "machine": machine()}


def main(argv: list[str] | None = None) -> None:
    p = parser("corpus_memory", __doc__)
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[100, 1000],
                   help="corpus sizes in MB, measured one after another (default 100 1000)")
    p.add_argument("--vocab", type=Path, help="a BERT vocab.txt (default: train one on the corpus, as bert_pretrain "
                                              "does without --vocab)")
    p.add_argument("--dupe-factor", type=int, default=1,
                   help="masked copies of the corpus (default 1; bert_pretrain's default 5 multiplies the examples "
                        "written to disk and the time, not the memory)")
    p.add_argument("--workdir", type=Path, help="where the generated text and prepared data go (default: the system's "
                                                "temporary folder; needs about 3x the largest size free)")
    args = p.parse_args(argv)
    res = run(args.sizes_mb, vocab=args.vocab, dupe_factor=args.dupe_factor, workdir=args.workdir)
    columns = ["input_mb", "seconds", "peak_pss_mb", "peak_anon_mb", "peak_file_mb", "main_peak_rss_mb", "examples",
               "examples_on_disk_mb"]
    growth = res["growth_per_input_mb"]
    text = "\n".join([
        "## corpus_memory: peak memory of data preparation against the corpus size",
        machine_line(res["machine"]), "", table(res["rows"], columns), "",
        "growth of each peak per MB of input between the smallest and the largest size (1.0: the whole corpus "
        "held once): " + ", ".join(f"{k} {v:.4f}" for k, v in growth.items() if v is not None)])
    publish(res, text, args.out)


if __name__ == "__main__":
    main()
