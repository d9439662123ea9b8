"""Run one step of data preparation in a forked child process, so that what its heap keeps dies with it.

Tokenising a large corpus makes and frees millions of small Python objects (token-id lists, one chunk of sentences
at a time). CPython's allocator does not give all of that memory back, so the main process's heap ended the step
larger the longer the corpus was, and the ``datasets.map`` workers forked for example creation inherited it
(benchmarks/corpus_memory). A child that does the step and exits takes that heap with it; only its small result
comes back through a pipe. Where ``fork`` is not available the step runs in this process.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def run_forked(step: Callable[[], T], *, what: str) -> T:
    """``step()`` in a forked child; its return value, or its exception raised here. ``what`` names the step in the
    error raised when the child dies without an answer (killed, out of memory)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return step()
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            answer: tuple[str, Any] = ("ok", step())
        except BaseException as exc:  # every failure goes back to the parent, which raises it
            answer = ("error", exc)
        try:
            writer.send(answer)
        except (pickle.PicklingError, TypeError, AttributeError):  # an exception that cannot be pickled
            writer.send(("error", RuntimeError(f"{what} failed: {answer[1]!r}")))
        writer.close()

    process = ctx.Process(target=child, name=what)
    process.start()
    writer.close()
    try:
        kind, value = reader.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"{what}: its process died without an answer (exit code {process.exitcode}; killed, or "
                           "out of memory?)") from None
    finally:
        reader.close()
    process.join()
    if kind == "error":
        raise value
    return value  # type: ignore[no-any-return]
