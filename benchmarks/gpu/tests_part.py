"""Part ``tests``: ``pytest -m gpu tests/gpu`` in a child process; outcomes and failure messages to JSON.

In the CPU smoke the same tests run on the CPU (``KAISA_GPU_TESTS_ON_CPU=1``); those that need CUDA itself skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.gpu.context import Context

REPO = Path(__file__).resolve().parents[2]
ON_CPU_ENV = "KAISA_GPU_TESTS_ON_CPU"  # tests/gpu/conftest.py reads it


def junit_outcomes(path: Path) -> list[dict[str, Any]]:
    """One row per test case of a JUnit XML report: name, outcome, seconds, message (first 2000 characters)."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or "") + "\n" + (node.text or "")
                break
        rows.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                     "seconds": float(case.get("time") or 0.0), "message": message.strip()[:2000]})
    return rows


def run_pytest(ctx: Context, *, name: str, select: str | None = None,
               pythonpath: list[str] | None = None) -> dict[str, Any]:
    """Run tests/gpu (``-k select``) with ``pythonpath`` prepended; write and return ``gpu_<name>.json``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([*(pythonpath or []), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if ctx.smoke:
        env[ON_CPU_ENV] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-rfEs", "-p", "no:cacheprovider",
               f"--junitxml={xml}", *(["-k", select] if select else [])]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=max(30.0, ctx.seconds_left()))
            code, tail = proc.returncode, (proc.stdout + proc.stderr)[-6000:]
        except subprocess.TimeoutExpired as exc:
            code, tail = -1, f"pytest ran past the call's time budget: {exc}"
        rows = junit_outcomes(xml) if xml.exists() else []
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "error", "skipped")}
    print(tail)
    res = {"command": " ".join(cmd), "exit_code": code, "seconds": time.monotonic() - start, "counts": counts,
           "tests": rows, "output_tail": tail, "ok": code == 0 and counts["passed"] > 0}
    ctx.write(name, res)
    return res


def run(ctx: Context) -> dict[str, Any]:
    return run_pytest(ctx, name="tests", select=ctx.args.select)
