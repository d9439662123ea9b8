"""A real full disk during a save (the fault suite's other cases inject ENOSPC): the run's output lives on a
20 MiB tmpfs that holds two checkpoints of the tiny model but not a third. torch.save reports this as a
RuntimeError ("iostream error"), not an OSError; it must still stop the run with the checkpoint named, and
leave the previous checkpoint as the one a resume takes. Needs root to mount the tmpfs; skipped otherwise."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bert_pretrain.checkpoints import MARKER, newest_intact
from tests.support.bert_data import corpus_file
from tests.support.launch import run_deepspeed


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_disk_stops_the_run_naming_the_checkpoint(tmp_path: Path, small_disk: Path) -> None:
    corpus = corpus_file(tmp_path, articles=150)
    out = small_disk / "run"
    proc = run_deepspeed(["--module", "bert_pretrain", "--phase", "1", "--config", "ds_configs/bert_tiny_phase1.json",
                          "--data", str(corpus), "--data-cache", str(tmp_path / "data"), "--output", str(out),
                          "--max-steps", "6", "--eval-every", "3", "--eval-examples", "32", "--save-every", "2",
                          "--keep-checkpoints", "0", "--dupe-factor", "1"], check=False, timeout=300)
    ckpt = out / "checkpoints"
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert f"saving checkpoint {ckpt / 'step6'} failed" in proc.stderr and "MiB free there" in proc.stderr
    assert not (ckpt / "step6" / MARKER).exists() and (ckpt / "latest").read_text() == "step4"
    chosen = newest_intact(ckpt, world=2)
    assert chosen is not None and chosen.step == 4
