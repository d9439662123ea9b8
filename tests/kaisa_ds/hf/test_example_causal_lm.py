"""examples/hf_trainer_causal_lm.py as a user runs it: a Llama-style decoder (grouped-query attention) on WikiText-2
valid from ../shared/data, 2 CPU ranks under the deepspeed launcher, bf16, with configs that say only
``"kfac": {"enabled": true}``. It must learn (measured 2026-12-02, 40 steps: logged loss 7.88 -> 6.05 under ZeRO-1,
7.84 -> 6.06 under ZeRO-2; asserted: falls >= 1 nat), on a vocabulary learned on the text, with K-FAC on every
step and every linear layer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.launch import REPO_ROOT, run_deepspeed

SCRIPT = str(REPO_ROOT / "examples" / "hf_trainer_causal_lm.py")
WIKITEXT = REPO_ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.txt"
SUMMARY = re.compile(r"K-FAC steps (\d+), skipped windows (\d+), ZeRO stage (\d), precision (\w+), model vocabulary "
                     r"(\d+), K-FAC covers ([\d.]+)% of the linear-like parameters, first logged loss ([\d.]+), last "
                     r"logged loss ([\d.]+)")


@pytest.mark.skipif(not WIKITEXT.is_file(), reason=f"needs {WIKITEXT}")
@pytest.mark.parametrize("zero", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_causal_lm_example_learns_with_kfac_defaults_in_bf16(zero: int, tmp_path: Path) -> None:
    config = str(REPO_ROOT / "examples" / f"ds_config_causal_lm_zero{zero}.json")
    proc = run_deepspeed([SCRIPT, "--deepspeed", config, "--output", str(tmp_path / "run"), "--text", str(WIKITEXT),
                          "--bf16", "--max-steps", "40", "--save-steps", "40"])
    found = SUMMARY.search(proc.stdout + proc.stderr)
    assert found, (proc.stdout + proc.stderr)[-3000:]
    steps, skipped, stage, precision, vocab = int(found[1]), int(found[2]), int(found[3]), found[4], int(found[5])
    covered, first, last = float(found[6]), float(found[7]), float(found[8])
    assert (steps, skipped, stage, precision) == (40, 0, zero, "bf16")
    assert vocab >= 1000 and covered >= 99.0
    assert first - last >= 1.0, (first, last)
