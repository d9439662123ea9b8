"""benchmarks.accuracy on the GPU: the levers' accuracy is measured at BERT-Large only there (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import accuracy

pytestmark = pytest.mark.gpu


def test_accuracy_runs_its_model_and_preconditioners_on_the_device(device: torch.device, tmp_path: Path) -> None:
    res = accuracy.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--windows", "2", "--passes", "2",
                         "--variants", "1:fp32", "0.25:fp32:0.5", "--device", str(device),
                         "--out", str(tmp_path / "acc.json")])
    rows = {r["variant"]: r for r in res["rows"]}
    assert rows["1:fp32"]["precond_grad_err"] == 0
    assert rows["0.25:fp32:0.5"]["factor_err_one_window"] > 0.01
    assert res["settings"]["device"] == str(device)


def test_cuda_statistics_in_bf16_stay_within_bf16_rounding_of_fp32(device: torch.device) -> None:
    """FP32 inputs on CUDA go through a BF16 GEMM with FP32 accumulation: the statistic is within BF16's rounding
    (relative 2⁻⁸ per input, averaged over the rows) of the FP64 one."""
    from kaisa_ds.factors.statistics import gram

    x = torch.randn(4096, 256, device=device, generator=torch.Generator(device).manual_seed(0))
    want = (x.double().t() @ x.double()).float()
    for blocks in (1, 3):  # benchmarks.gram_blocks --device cuda times the split the default leaves off there
        got = gram(x, blocks=blocks)
        assert got.dtype == torch.float32
        assert float((got - want).norm() / want.norm()) < 2**-8
