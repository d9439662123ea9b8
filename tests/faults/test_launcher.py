"""Defect 9: stopping the mission (SIGTERM, Ctrl-C, a timeout) must stop the deepspeed launcher's ranks too;
killing only the launcher used to leave them running to the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mission.jobs import launch
from tests.support.launch import REPO_ROOT

LAUNCH = """
import sys
from pathlib import Path
from mission.jobs import launch
launch("tests.support.sleeper", [sys.argv[1]], ranks=2, log=Path(sys.argv[1]) / "job.log")
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has exited already


def _rank_pids(folder: Path, *, within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        files = sorted(folder.glob("rank*.pid"))
        if len(files) == 2 and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not start; log:\n{(folder / 'job.log').read_text()[-3000:]}")


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    for pid in pids:  # do not leave them behind when the check fails
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    return False


def test_sigterm_of_the_mission_stops_the_ranks(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    mission = subprocess.Popen([sys.executable, "-c", LAUNCH, str(tmp_path)], cwd=REPO_ROOT, env=env)
    try:
        ranks = _rank_pids(tmp_path, within=120)
        mission.send_signal(signal.SIGTERM)
        mission.wait(timeout=60)
    finally:
        if mission.poll() is None:
            mission.kill()
    assert _gone_within(ranks, 30), "ranks outlived the mission"


@pytest.mark.slow  # ~20 s; default suite: a SIGTERM stops the ranks below
def test_a_timeout_kills_the_ranks(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 20 s and was killed with its ranks"):
        launch("tests.support.sleeper", [str(tmp_path)], ranks=2, log=tmp_path / "job.log", timeout=20)
    assert time.monotonic() - started < 60
    ranks = [int(f.read_text()) for f in tmp_path.glob("rank*.pid")]
    assert len(ranks) == 2 and _gone_within(ranks, 10)
