"""kaisa_ds Lamb and PolyWarmUpScheduler under deepspeed.initialize (1 process, in a subprocess so DeepSpeed's
process group stays out of pytest): same steps as plain Lamb, checkpoint resume, bf16 fp32-master path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.launch import REPO_ROOT, free_port

SCRIPT = Path(__file__).with_name("ds_lamb_script.py")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path_factory.mktemp("ds_ckpt"))], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{SCRIPT.name} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_fp32_zero0_engine_steps_like_plain_lamb(result: dict) -> None:
    fp32 = result["fp32"]
    assert fp32["engine_optimizer_is_lamb"]  # fp32 ZeRO-0: DeepSpeed steps the client optimizer itself
    assert fp32["moved"] > 1e-3 and fp32["max_diff_vs_plain"] < 1e-6
    assert fp32["lamb_steps"] == [2, 2]


def test_engine_drives_the_poly_warmup_schedule(result: dict) -> None:
    # warmup 0.5 of 4 steps: step 1 at progress 1/4 → 0.05·0.25/0.5; step 2 at progress 2/4 → 0.05·0.5**0.5
    assert result["fp32"]["lrs"] == pytest.approx([0.025, 0.05 * 0.5**0.5])


def test_checkpoint_resume_repeats_the_step_exactly(result: dict) -> None:
    assert result["fp32"]["max_diff_resumed"] == 0.0
    assert result["fp32"]["resumed_lr"] == pytest.approx(0.05 * 0.5**0.5)


def test_bf16_zero0_hands_lamb_fp32_masters(result: dict) -> None:
    bf16 = result["bf16"]
    assert bf16["wrapper"] == "FP16_UnfusedOptimizer" and bf16["lamb_param_dtypes"] == ["torch.float32"]
    assert all(0 < loss < 10 for loss in bf16["losses"])
