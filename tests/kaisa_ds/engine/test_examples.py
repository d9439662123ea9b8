"""examples/hf_trainer_mlm.py as a user runs it: 2 CPU ranks under the deepspeed launcher and under torchrun, a few
steps, then --resume from its checkpoint."""

from __future__ import annotations

from pathlib import Path

from tests.support.launch import REPO_ROOT, run_deepspeed, run_torchrun

SCRIPT = str(REPO_ROOT / "examples" / "hf_trainer_mlm.py")
CONFIG = str(REPO_ROOT / "examples" / "ds_config_kfac.json")
TINY = ["--deepspeed", CONFIG, "--hidden", "32", "--seq-len", "32", "--save-steps", "2"]


def test_hf_trainer_example_trains_with_kfac_and_resumes(tmp_path: Path) -> None:
    out = ["--output", str(tmp_path / "run")]
    first = run_deepspeed([SCRIPT, *TINY, *out, "--max-steps", "2"])
    assert "K-FAC steps 2, skipped windows 0" in first.stdout + first.stderr
    resumed = run_torchrun([SCRIPT, *TINY, *out, "--max-steps", "4", "--resume"])
    assert "K-FAC steps 4, skipped windows 0" in resumed.stdout + resumed.stderr  # 2 restored + 2 new
    assert (tmp_path / "run" / "checkpoint-4" / "global_step4" / "mp_rank_00_model_states.pt").is_file()
