"""Multi-process launch helpers for tests: gloo process groups and the deepspeed launcher."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kaisa_ds.engine.launch import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def _worker(
    rank: int, world_size: int, init_file: str, fn: Callable[..., Any], args: tuple[Any, ...], queue: Any
) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        buf = io.BytesIO()  # plain bytes: shared-memory tensors would die with this process
        torch.save(result, buf)
        queue.put((rank, True, buf.getvalue()))
    except BaseException:  # the traceback is sent to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return each rank's result.

    ``fn`` must be importable (a module-level function). Results must be picklable; tensors are
    returned as copies. A failure on any rank raises with that rank's traceback.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, init_file, fn, args, queue), daemon=False)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        errors: list[str] = []
        try:
            for _ in range(world_size):
                rank, ok, payload = queue.get(timeout=timeout)
                if ok:
                    results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
                else:
                    errors.append(f"rank {rank} failed:\n{payload}")
                    break
        finally:
            for p in procs:
                p.join(timeout=5 if errors else timeout)
                if p.is_alive():
                    p.kill()
        if errors:
            raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]


_LAUNCHER_TIMED_OUT = ""  # set when a launch hits its timeout, so a hung environment fails fast, not for hours


def run_deepspeed(
    script_args: Sequence[str], *, num_ranks: int = 2, timeout: float = 600.0, env: dict[str, str] | None = None,
    cwd: Path | None = None, check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``deepspeed --num_gpus N --master_port P <script_args>`` on CPU ranks and return the result.

    Raises with the captured output when the command fails (unless ``check=False``: a fault test expects it
    to), so test failures show the ranks' logs.
    """
    launcher = Path(sys.executable).with_name("deepspeed")
    cmd = [str(launcher), "--num_gpus", str(num_ranks), "--master_port", str(free_port()), *script_args]
    return _run_launcher(cmd, timeout=timeout, env=env, cwd=cwd, check=check)


def run_torchrun(script_args: Sequence[str], *, num_ranks: int = 2, timeout: float = 600.0,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``torchrun --nproc_per_node N --master_port P <script_args>`` on CPU ranks (as ``run_deepspeed``)."""
    launcher = Path(sys.executable).with_name("torchrun")
    cmd = [str(launcher), "--nproc_per_node", str(num_ranks), "--master_port", str(free_port()), *script_args]
    return _run_launcher(cmd, timeout=timeout, env=env, cwd=None, check=True)


def _run_launcher(cmd: list[str], *, timeout: float, env: dict[str, str] | None, cwd: Path | None,
                  check: bool) -> subprocess.CompletedProcess[str]:
    global _LAUNCHER_TIMED_OUT
    if _LAUNCHER_TIMED_OUT:  # one hung launch already cost its timeout: fail the others at once
        raise RuntimeError(f"not launched: an earlier launch timed out ({_LAUNCHER_TIMED_OUT})")
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), full_env.get("PYTHONPATH", "")])
    with subprocess.Popen(cmd, cwd=str(cwd or REPO_ROOT), env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as popen:
        try:
            stdout, stderr = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            os.killpg(popen.pid, signal.SIGKILL)  # the ranks too, not only the launcher
            stdout, stderr = popen.communicate()
            _LAUNCHER_TIMED_OUT = " ".join(cmd[5:8])
            raise RuntimeError(f"timed out after {timeout:.0f} s: {' '.join(cmd)}\n--- stdout ---\n"
                               f"{stdout[-8000:]}\n--- stderr ---\n{stderr[-8000:]}") from exc
    proc = subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n--- stdout ---\n{proc.stdout[-8000:]}"
            f"\n--- stderr ---\n{proc.stderr[-8000:]}"
        )
    return proc
