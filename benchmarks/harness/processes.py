"""Fresh processes for the benchmarks: gloo ranks of one world (:func:`spawn`), or one clean process per
configuration (:func:`isolated`) so that per-process figures such as peak memory start from nothing."""

from __future__ import annotations

import io
import os
import queue as queue_module
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Child processes fork from one server that has already imported torch, transformers' BERT and kaisa_ds:
# each rank then starts in a fraction of a second instead of re-importing for ~5 s. The server never runs
# tensor code, so no thread pool is forked.
PRELOAD = ["torch", "transformers.models.bert.modeling_bert", "kaisa_ds.preconditioner", "benchmarks.harness.models",
           "benchmarks.harness.batches", "bert_pretrain.model"]


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
