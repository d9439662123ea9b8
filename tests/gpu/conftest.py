"""GPU tests (``pytest -m gpu tests/gpu``): the CUDA paths a CPU cannot cover. Skipped without CUDA.

``KAISA_GPU_TESTS_ON_CPU=1`` runs them on the CPU instead (what ``python -m benchmarks.gpu --cpu-smoke`` does,
so the code is exercised before the first GPU minutes); tests that need CUDA itself still skip there.
Torch.distributed is started once per session as a single rank (NCCL on a GPU, gloo on a CPU).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

ON_CPU_ENV = "KAISA_GPU_TESTS_ON_CPU"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (python -m benchmarks.gpu --part tests runs these)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available() or os.environ.get(ON_CPU_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"needs CUDA (set {ON_CPU_ENV}=1 to run on the CPU)")
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def single_rank(device: torch.device) -> Iterator[None]:
    """A one-rank process group for kaisa_ds.initialize; fp16 allowed on the CPU (as the CPU engine tests do)."""
    from deepspeed.accelerator import get_accelerator

    from kaisa_ds.engine.launch import init_distributed

    if device.type == "cpu":
        get_accelerator().is_fp16_supported = lambda: True
    init_distributed()
    yield


def needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA itself (not run by the CPU smoke)")
