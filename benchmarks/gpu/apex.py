"""Part ``apex``: build NVIDIA Apex's ``amp_C`` extension (what FusedLAMB needs) from a carried source, then run the
Apex and fused-LAMB GPU tests with it importable.

NVIDIA Apex is not on PyPI (the PyPI ``apex`` is an unrelated package: never install it). scripts/build_gpu_wheels.sh
``--apex-mirror DIR`` packs Apex's Python package and the ``amp_C`` sources from a git mirror of NVIDIA/apex into
``.whl/apex-src.tar.gz`` (ignored by git, carried with ``.whl``). Only ``amp_C`` is JIT-built with
``torch.utils.cpp_extension.load`` for this GPU's architecture, not Apex's whole ``--cuda_ext`` set.
"""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.context import Context
from benchmarks.gpu.tests_part import REPO, run_pytest

TARBALL = REPO / ".whl" / "apex-src.tar.gz"
WORK = Path("/tmp/kaisa_apex")
# Apex's setup.py, CUDAExtension "amp_C"
AMP_C_SOURCES = ["csrc/amp_C_frontend.cpp", "csrc/multi_tensor_sgd_kernel.cu", "csrc/multi_tensor_scale_kernel.cu",
                 "csrc/multi_tensor_axpby_kernel.cu", "csrc/multi_tensor_l2norm_kernel.cu",
                 "csrc/multi_tensor_l2norm_kernel_mp.cu", "csrc/multi_tensor_l2norm_scale_kernel.cu",
                 "csrc/multi_tensor_lamb_stage_1.cu", "csrc/multi_tensor_lamb_stage_2.cu", "csrc/multi_tensor_adam.cu",
                 "csrc/multi_tensor_adagrad.cu", "csrc/multi_tensor_novograd.cu", "csrc/multi_tensor_lamb.cu",
                 "csrc/multi_tensor_lamb_mp.cu", "csrc/update_scale_hysteresis.cu"]
BUILD_HINT = ("fetch github:NVIDIA/apex with the search tool's fetch, then scripts/build_gpu_wheels.sh "
              "--apex-mirror /work/.mirror/NVIDIA+apex/repo (writes .whl/apex-src.tar.gz)")


def unpack(tarball: Path, dest: Path) -> Path:
    """Extract the carried source; check that the Python package and every amp_C source are in it."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    missing = [s for s in [*AMP_C_SOURCES, "apex/__init__.py", "apex/optimizers/fused_lamb.py"]
               if not (dest / s).exists()]
    if missing:
        raise FileNotFoundError(f"{tarball} lacks {missing}: rebuild it ({BUILD_HINT})")
    return dest


def build_amp_c(src: Path, build: Path) -> float:
    """JIT-build amp_C into ``build`` (where ``import amp_C`` then finds it); seconds taken."""
    from torch.utils.cpp_extension import load

    major, minor = torch.cuda.get_device_capability()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    build.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    load(name="amp_C", sources=[str(src / s) for s in AMP_C_SOURCES], build_directory=str(build),
         extra_cflags=["-O3"], extra_cuda_cflags=["-lineinfo", "-O3", "--use_fast_math"],
         extra_include_paths=[str(src / "csrc")], verbose=True)
    return time.monotonic() - start


def run(ctx: Context) -> dict[str, Any]:
    tarball = ctx.args.apex_src or TARBALL
    out: dict[str, Any] = {"tarball": str(tarball)}
    if not tarball.exists():
        out.update(ok=ctx.smoke, why=f"no Apex source carried at {tarball}: {BUILD_HINT}")
        ctx.write("apex", out)
        return out
    src = unpack(tarball, WORK / "src")
    out["sources"] = AMP_C_SOURCES
    if ctx.smoke:
        out.update(ok=True, why="CPU smoke: source unpacked and checked; amp_C needs nvcc and a GPU to build")
        ctx.write("apex", out)
        return out
    out["build_seconds"] = build_amp_c(src, WORK / "build")
    tests = run_pytest(ctx, name="apex_tests", select="apex or config_lamb", pythonpath=[str(src), str(WORK / "build")])
    apex_rows = [r for r in tests["tests"] if "apex" in r["test"]]
    out["tests"] = {r["test"]: r["outcome"] for r in tests["tests"]}
    out["ok"] = bool(apex_rows) and all(r["outcome"] == "passed" for r in apex_rows) and tests["exit_code"] == 0
    ctx.write("apex", out)
    return out
