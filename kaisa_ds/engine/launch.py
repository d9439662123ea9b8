"""Start torch.distributed through DeepSpeed, for scripts run by the deepspeed launcher or as a lone process."""

from __future__ import annotations

import os
import socket

import torch

from kaisa_ds.distributed.exit_grace import register_exit_grace

SHM_OPT_IN = "KAISA_DS_CPU_SHM_COMM"  # set to 1 to let DeepSpeed build its CPU shared-memory all-reduce op


def free_port() -> int:
    """A TCP port that is free right now on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def skip_cpu_shm_build() -> None:
    """Stop DeepSpeed 0.19 from JIT-compiling ``deepspeed_shm_comm`` on CPU ranks.

    On the CPU accelerator ``TorchBackend.__init__`` always builds that C++ op (≈2 minutes with a compiler on a
    2-core machine, a failure without one, and a hang of the peers when its kernels fault) although only
    ``inference_all_reduce`` uses it; training collectives go through gloo either way. Set
    ``KAISA_DS_CPU_SHM_COMM=1`` to keep DeepSpeed's default.
    """
    if os.environ.get(SHM_OPT_IN) == "1":
        return
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        for name in list(compatible):
            if "shm_comm" in name:
                compatible[name] = False


def init_distributed() -> tuple[int, int]:
    """Start torch.distributed through DeepSpeed (no arguments: the launcher's environment says everything).

    Under a launcher the environment names the rank; a plain ``python script.py`` becomes a 1-rank group on a
    free loopback port. CPU ranks of one machine share its cores, so each gets ``cores / LOCAL_SIZE`` threads
    unless ``OMP_NUM_THREADS`` says otherwise (oversubscribed threads made steps ~10x slower on 2 cores).

    Returns:
        ``(rank, world_size)``.
    """
    import deepspeed
    from deepspeed import comm as dist

    if "RANK" not in os.environ:
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": os.environ.get("MASTER_PORT", str(free_port()))})
    if "OMP_NUM_THREADS" not in os.environ and not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_SIZE", "1"))))
    skip_cpu_shm_build()
    deepspeed.init_distributed(verbose=False)
    register_exit_grace()
    return dist.get_rank(), dist.get_world_size()
