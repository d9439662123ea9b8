"""Launching the pipeline's jobs under the deepspeed launcher, each with its own log file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kaisa_ds.engine.launch import free_port

REPO = Path(__file__).resolve().parents[1]


def launch(module: str, args: list[str], *, ranks: int, log: Path) -> float:
    """Run ``deepspeed --num_gpus ranks --module <module> <args>``; return its wall seconds.

    Output goes to ``log``; on failure the end of the log is shown and the job's command is named, so a
    failed stage is never silent.
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
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{module} failed (exit {proc.returncode}); full log: {log}\n{tail}")
    return time.perf_counter() - start
