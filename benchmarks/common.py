"""Shared benchmark helpers: machine description, Markdown tables, JSON output, timing, BERT models, spawned ranks.

Every benchmark measures its figures side by side in one run and writes them with the machine that made them,
so a table can always be traced to a command, a machine and a date.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import queue as queue_module
import random
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from bert_pretrain.data.examples import ExampleSettings, Specials, mask_tokens
from bert_pretrain.model import KAISA_SKIP as KAISA_SKIP  # re-exported: the benchmarks import it from here
from bert_pretrain.model import SIZES, PretrainingLoss, build_model

RESULTS = Path(__file__).parent / "results"
BERT_SIZES = SIZES  # hidden, layers, heads, intermediate: bert_pretrain's, the sizes users train
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "GOMP_SPINCOUNT")


def machine() -> dict[str, Any]:
    """What ran the benchmark: CPU model and cores, torch/transformers versions, GPU name, date."""
    import transformers

    info: dict[str, Any] = {
        "cpu_model": platform.processor() or platform.machine(), "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "gpu": None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_average_1m": os.getloadavg()[0],  # other work on a shared machine makes timings noisier
        "threading_env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ},
    }
    with contextlib.suppress(OSError, StopIteration):
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                                 .splitlines() if line.startswith("model name"))
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def machine_line(info: dict[str, Any]) -> str:
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"
    env = "".join(f", {k}={v}" for k, v in info.get("threading_env", {}).items())
    return (f"{info['cpu_model']} ({info['cpu_cores']} cores, {info['torch_threads']} torch threads{env}){gpu}; "
            f"torch {info['torch']}, transformers {info['transformers']}; {info['date']}")


def write_json(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def publish(res: dict[str, Any], text: str, out: Path) -> None:
    """Print a benchmark's tables, write its JSON (settings, raw figures, machine) and say where it went."""
    print(text)
    write_json(res, out)
    print(f"\nwrote {out}")


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table (also readable as plain text); floats to 4 significant digits."""
    def cell(v: Any) -> str:
        if isinstance(v, bool) or v is None:
            return "" if v is None else str(v)
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose --help shows the module docstring, with the common ``--out``."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS / f"{name}.json", help="JSON output (default: %(default)s)")
    return p


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def timed(fn: Callable[[], Any], *, cuda: bool) -> float:
    """Wall seconds of one call; on a GPU the queue is drained before and after."""
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bert_for_pretraining(size: str, *, vocab: int = 30522, seq: int = 128, seed: int = 0) -> torch.nn.Module:
    """HF ``BertForPreTraining`` of a named size (bert_pretrain's ``build_model``; nothing downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if size not in BERT_SIZES:
        raise ValueError(f"unknown BERT size {size!r}; allowed: {', '.join(BERT_SIZES)}")
    torch.manual_seed(seed)
    return build_model(size, vocab_size=vocab, max_positions=max(512, seq))  # type: ignore[no-any-return]


def pretraining_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """bert_pretrain's MLM + NSP loss (the vocabulary-wide decoder only at the masked positions) of ``model``."""
    return PretrainingLoss(model)(batch)  # type: ignore[no-any-return]


def masked_batch(rows: list[list[int]], *, specials: Specials, device: torch.device | str,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Token rows (each ``seq - 2`` ids) as ``[CLS] ... [SEP]`` segments masked by bert_pretrain's ``mask_tokens``
    (15%, 80/10/10), random NSP labels: a batch in the format the pretraining data loader yields."""
    rng = random.Random(seed)
    seq = len(rows[0]) + 2
    settings = ExampleSettings(max_seq_length=seq, max_predictions=max(1, round(seq * ExampleSettings.masked_lm_prob)))
    cols: dict[str, list[Any]] = {"input_ids": [], "masked_lm_positions": [], "masked_lm_ids": []}
    for row in rows:
        masked, positions, ids = mask_tokens([specials.cls, *row, specials.sep], settings, specials, rng)
        pad = settings.max_predictions - len(positions)
        cols["input_ids"].append(masked)
        cols["masked_lm_positions"].append(positions + [0] * pad)
        cols["masked_lm_ids"].append(ids + [-100] * pad)
    out = {k: torch.tensor(v) for k, v in cols.items()}
    out["token_type_ids"] = torch.zeros(len(rows), seq, dtype=torch.long)
    out["attention_mask"] = torch.ones(len(rows), seq, dtype=torch.long)
    out["next_sentence_label"] = torch.tensor([rng.randrange(2) for _ in rows])
    return {k: v.to(device) for k, v in out.items()}


def random_batch(batch: int, seq: int, vocab: int, device: torch.device | str,
                 *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids in the loader's format (see :func:`masked_batch`)."""
    rng = random.Random(seed)
    specials = Specials(pad=0, cls=2, sep=3, mask=4, vocab_size=vocab)  # a trained vocabulary's special ids
    low = min(1000, vocab // 2)
    rows = [[rng.randrange(low, vocab) for _ in range(seq - 2)] for _ in range(batch)]
    return masked_batch(rows, specials=specials, device=device, seed=seed + 1)


# Child processes fork from one server that has already imported torch, transformers' BERT and kaisa_ds:
# each rank then starts in a fraction of a second instead of re-importing for ~5 s. The server never runs
# tensor code, so no thread pool is forked.
PRELOAD = ["torch", "transformers.models.bert.modeling_bert", "kaisa_ds.preconditioner", "benchmarks.common",
           "bert_pretrain.model"]


def _context() -> Any:
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def spawn(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 1800.0) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` fresh gloo ranks (one torch thread each); return the
    ranks' results. ``fn`` must be a module-level function and its results picklable. A rank that fails,
    dies or runs past ``timeout`` seconds raises here with its traceback or exit code.
    """
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        return _run_processes([(r, world, init, fn, args) for r in range(world)], timeout=timeout)


def isolated(fn: Callable[..., Any], arg_lists: Sequence[tuple[Any, ...]], *, parallel: int = 2,
             timeout: float = 1800.0) -> list[Any]:
    """Run ``fn(0, 1, *args)`` for each ``args`` in its own fresh process (no process group), ``parallel``
    at a time, so per-process figures such as peak memory start clean; results in order."""
    results: list[Any] = []
    for start in range(0, len(arg_lists), parallel):
        chunk = arg_lists[start:start + parallel]
        results += _run_processes([(0, 1, None, fn, args) for args in chunk], timeout=timeout)
    return results


def _run_processes(jobs: list[tuple[int, int, str | None, Callable[..., Any], tuple[Any, ...]]], *,
                   timeout: float) -> list[Any]:
    ctx = _context()
    results_queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(i, *job, results_queue)) for i, job in enumerate(jobs)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < len(jobs):
            try:
                index, ok, payload = results_queue.get(timeout=1.0)
            except queue_module.Empty:
                dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"child processes failed without a result (index, exit code): {dead} "
                                       f"or ran past {timeout:.0f} s") from None
                continue
            if not ok:
                rank, world = jobs[index][:2]
                raise RuntimeError(f"rank {rank} of {world} (job {index}) failed:\n{payload}")
            results[index] = torch.load(io.BytesIO(payload), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=30 if len(results) == len(jobs) else 1)
            if p.is_alive():
                p.kill()
    return [results[i] for i in range(len(jobs))]


def _child(index: int, rank: int, world: int, init: str | None, fn: Callable[..., Any], args: tuple[Any, ...],
           out: Any) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if init is not None:
            dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
        buf = io.BytesIO()  # plain bytes: shared-memory tensors would die with this process
        torch.save(fn(rank, world, *args), buf)
        out.put((index, True, buf.getvalue()))
    except BaseException:  # the traceback travels to the parent
        out.put((index, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
