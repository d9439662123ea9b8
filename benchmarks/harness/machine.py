"""What ran a benchmark: CPU, cores, threads and their environment, library versions, GPU, date and load."""

from __future__ import annotations

import contextlib
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

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
        # one id per boot: runs compared by wall time must share it (a restarted machine may run at another speed)
        "boot_id": None,
    }
    with contextlib.suppress(OSError):
        info["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with contextlib.suppress(OSError, StopIteration):
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                                 .splitlines() if line.startswith("model name"))
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def machine_line(info: dict[str, Any]) -> str:
    """One line naming the machine of :func:`machine`, printed above every benchmark's tables."""
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"
    env = "".join(f", {k}={v}" for k, v in info.get("threading_env", {}).items())
    return (f"{info['cpu_model']} ({info['cpu_cores']} cores, {info['torch_threads']} torch threads{env}){gpu}; "
            f"torch {info['torch']}, transformers {info['transformers']}; {info['date']}")
