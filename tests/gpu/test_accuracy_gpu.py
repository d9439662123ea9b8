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
