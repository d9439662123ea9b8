"""examples/hf_trainer_mlm.py as a user runs it, on WikiText-2 valid from ../shared/data: 2 CPU ranks under the
deepspeed launcher for 60 steps (the model must learn: vocabulary >= 1000 tokens, [UNK] < 5%, logged loss falls
>= 1 nat; a 5-token vocabulary cannot pass), then --resume under torchrun, which must reuse the saved vocabulary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.launch import REPO_ROOT, run_deepspeed, run_torchrun

SCRIPT = str(REPO_ROOT / "examples" / "hf_trainer_mlm.py")
CONFIG = str(REPO_ROOT / "examples" / "ds_config_kfac.json")
WIKITEXT = REPO_ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.txt"
SUMMARY = re.compile(r"K-FAC steps (\d+), skipped windows 0, model vocabulary (\d+), first logged loss ([\d.]+), "
                     r"last logged loss ([\d.]+)")
UNK = re.compile(r"\[UNK\] ([\d.]+)% of (\d+) tokens")


def _summary(text: str) -> tuple[int, int, float, float]:
    found = SUMMARY.search(text)
    assert found, text[-3000:]
    return int(found[1]), int(found[2]), float(found[3]), float(found[4])


@pytest.mark.skipif(not WIKITEXT.is_file(), reason=f"needs {WIKITEXT}")
def test_hf_trainer_example_learns_with_kfac_and_resumes_with_its_vocabulary(tmp_path: Path) -> None:
    out = ["--deepspeed", CONFIG, "--output", str(tmp_path / "run")]
    first = run_deepspeed([SCRIPT, *out, "--text", str(WIKITEXT), "--max-steps", "60", "--save-steps", "60"])
    steps, vocab, loss0, loss1 = _summary(first.stdout + first.stderr)
    assert steps == 60 and vocab >= 1000
    assert loss0 - loss1 >= 1.0, (loss0, loss1)
    assert float(UNK.findall(first.stdout)[0][0]) < 5.0
    saved = (tmp_path / "run" / "vocab.txt").read_bytes()
    # resume on other text (a quarter of the file): a vocabulary learned again would differ; the saved one must stay
    part = tmp_path / "part.txt"
    lines = WIKITEXT.read_text(encoding="utf-8").splitlines()
    part.write_text("\n".join(lines[: len(lines) // 4]) + "\n", encoding="utf-8")
    resumed = run_torchrun([SCRIPT, *out, "--text", str(part), "--max-steps", "62", "--save-steps", "2", "--resume"])
    steps, vocab, _, loss2 = _summary(resumed.stdout + resumed.stderr)
    assert steps == 62 and vocab >= 1000  # 60 restored + 2 new
    assert (tmp_path / "run" / "vocab.txt").read_bytes() == saved, "--resume must reuse the saved vocabulary"
    assert loss2 < loss0 - 1.0  # the restored model, not a fresh one
    assert (tmp_path / "run" / "checkpoint-62" / "global_step62" / "mp_rank_00_model_states.pt").is_file()


def test_hf_trainer_example_refuses_a_resume_with_another_vocab(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n", encoding="utf-8")
    other = tmp_path / "vocab.txt"
    other.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n", encoding="utf-8")
    proc = run_deepspeed([SCRIPT, "--deepspeed", CONFIG, "--output", str(out), "--vocab", str(other), "--resume",
                          "--max-steps", "1"], num_ranks=1, check=False)
    assert proc.returncode != 0
    assert "differs from" in proc.stdout + proc.stderr  # names both files and the fix
