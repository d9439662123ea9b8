"""kaisa_ds.attach_to_accelerator in a hand-written accelerate loop with a DeepSpeed plugin, 2 CPU ranks under
torchrun: losses and K-FAC factors equal those of kaisa_ds.initialize on the same micro-batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.kaisa_ds.engine import hf_worker
from tests.support.launch import run_torchrun


def test_accelerate_loop_matches_kaisa_ds_initialize(tmp_path: Path) -> None:
    out = tmp_path / "accelerate"
    run_torchrun([str(Path(hf_worker.__file__)), "accelerate", str(out)])
    got = torch.load(f"{out}.rank0.pt", weights_only=False)
    loop, reference = got["accelerate"], got["reference"]
    assert loop["kfac_steps"] == reference["kfac_steps"] == 3
    assert loop["losses"] == pytest.approx(reference["losses"], rel=1e-6)  # measured: identical
    for name, (a, g) in reference["factors"].items():
        assert torch.allclose(loop["factors"][name][0], a, rtol=1e-5, atol=0), f"{name} A"
        assert torch.allclose(loop["factors"][name][1], g, rtol=1e-5, atol=0), f"{name} G"


def test_attach_without_a_deepspeed_engine_says_how_to_get_one() -> None:
    from kaisa_ds import attach_to_accelerator

    class NoDeepSpeed:
        deepspeed_engine_wrapped = None

    with pytest.raises(ValueError, match="DeepSpeedPlugin"):
        attach_to_accelerator(NoDeepSpeed())
