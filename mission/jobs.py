"""Launching the pipeline's jobs under the deepspeed launcher, each with its own log file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from kaisa_ds.engine.launch import free_port

REPO = Path(__file__).resolve().parents[1]


def launch(module: str, args: list[str], *, ranks: int, log: Path, timeout: float | None = None) -> float:
    """Run ``deepspeed --num_gpus ranks --module <module> <args>``; return its wall seconds.

    Output goes to ``log``; on failure the end of the log is shown and the job's command is named, so a
    failed stage is never silent. The launcher runs in its own process group and the whole group (the
    launcher *and* its ranks) is killed on a timeout, on Ctrl-C or SIGTERM of this process, or if this
    process fails: killing the launcher alone leaves its ranks training to the end.
    """
    launcher = Path(sys.executable).with_name("deepspeed")
    cmd = [str(launcher), "--num_gpus", str(ranks), "--master_port", str(free_port()), "--module", module, *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        with _kill_group_on_exit(proc):
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{module} timed out after {timeout:.0f} s and was killed with its ranks; "
                                   f"full log: {log}") from None
    if returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{module} failed (exit {returncode}); full log: {log}\n{tail}")
    return time.perf_counter() - start


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group of ``proc`` (its ranks included), then SIGKILL what is left after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the launcher is gone; make sure no rank outlives it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        return


@contextlib.contextmanager
def _kill_group_on_exit(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Turn SIGTERM into an exception while ``proc`` runs, and kill its group unless it ended by itself."""
    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        yield
    finally:
        if proc.poll() is None:
            kill_group(proc)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
