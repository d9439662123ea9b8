"""Defects 1, 3, 5 and 6 end to end on 2 CPU ranks: a rank killed mid-step, a rank killed mid-save, a full
disk during a save, a corrupt checkpoint, a torn metrics line, a lost data-cache vocabulary and changed data;
the final --resume must log exactly the losses of an uninterrupted fp32 run, and resuming the finished run
must leave every result as it was.

Faults are injected with the test-only ``BERT_PRETRAIN_FAULT`` variable (bert_pretrain/faults.py): SIGKILL of
the rank itself at an exact point, and ``OSError(ENOSPC)`` raised inside the checkpoint save. test_disk_full.py
fills a real (size-limited, root-only) file system instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bert_pretrain.checkpoints import MARKER
from bert_pretrain.faults import ENV
from tests.support.bert_data import corpus_file
from tests.support.launch import REPO_ROOT, run_deepspeed

STEPS = 8


def _args(root: Path, out: str, *extra: str) -> list[str]:
    return ["--phase", "1", "--config", "ds_configs/bert_tiny_phase1_kfac.json", "--data", str(root / "corpus.txt"),
            "--data-cache", str(root / "data"), "--output", str(root / out), "--max-steps", str(STEPS),
            "--eval-every", "4", "--eval-examples", "32", "--save-every", "2", "--keep-checkpoints", "0",
            "--dupe-factor", "1", *extra]


def _launch(root: Path, out: str, *extra: str, fault: str = "") -> subprocess.CompletedProcess[str]:
    return run_deepspeed(["--module", "bert_pretrain", *_args(root, out, *extra)], check=not fault, timeout=300,
                         env={ENV: fault} if fault else None)


def _one_process(root: Path, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bert_pretrain", *_args(root, out, *extra)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"})


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in (json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines())}


def _snapshot(run: Path) -> dict[str, Any]:
    return {str(p.relative_to(run)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("faults")
    corpus_file(folder, articles=150)
    return folder


@pytest.mark.slow  # ~130 s; default suite: resume in kaisa_ds/checkpoint/test_shards.py; full disk: test_disk_full.py
def test_kills_full_disk_and_corruption_then_resume_matches_an_uninterrupted_run(root: Path) -> None:
    _launch(root, "ref")
    reference = _losses(root / "ref")
    run = root / "faulty"
    ckpt = run / "checkpoints"

    start = time.perf_counter()  # rank 1 killed before step 5: the launcher must stop rank 0 too
    proc = _launch(root, "faulty", fault="step:1:5:kill")
    assert proc.returncode != 0 and time.perf_counter() - start < 120
    assert sorted(_losses(run)) == [1, 2, 3, 4]

    proc = _launch(root, "faulty", "--resume", fault="save:0:6:enospc")  # the disk fills while saving step 6
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert f"saving checkpoint {ckpt / 'step6'} failed" in proc.stderr and "No space left" in proc.stderr
    assert not (ckpt / "step6" / MARKER).exists()

    start = time.perf_counter()  # rank 0 killed inside the save of step 6, rank 1 waiting at its barrier
    proc = _launch(root, "faulty", "--resume", fault="save:0:6:kill")
    assert proc.returncode != 0 and time.perf_counter() - start < 120
    assert (ckpt / "step6" / "mp_rank_00_model_states.pt").is_file() and not (ckpt / "step6" / MARKER).exists()
    assert (ckpt / "step6" / "kfac_rank001_of_002.pt").is_file()  # the K-FAC shards too: only the marker is missing
    assert (ckpt / "latest").read_text() == "step4"  # never names a half-written checkpoint
    (ckpt / "latest").write_text("step6")  # as DeepSpeed itself, or an older version of this code, would have

    corpus = root / "corpus.txt"
    original = corpus.read_bytes()
    corpus.write_bytes(original + b"\n\nA new document. It changes the data.\n")
    proc = _one_process(root, "faulty", "--resume")
    assert proc.returncode == 2 and "--data files changed since" in proc.stderr, proc.stderr[-3000:]
    corpus.write_bytes(original)  # same text again, new mtime: accepted

    rng = ckpt / "step4" / "rng_rank001.pt"
    rng.write_bytes(rng.read_bytes()[:100])  # step 4 corrupt as well: step 2 is the newest intact one
    (root / "data" / "vocab.txt").unlink()  # the cache lost its vocabulary: the checkpoint's is reused
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 7, "loss": 3.')  # torn by a kill mid-write
    proc = _launch(root, "faulty", "--resume")
    assert "skipping checkpoint step6" in proc.stderr and f"{rng} has 100 bytes" in proc.stderr, proc.stderr[-3000:]
    assert f"falling back to {ckpt / 'step2'}" in proc.stderr and "torn last line" in proc.stderr
    resumed = _losses(run)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [resumed[s] for s in range(1, STEPS + 1)] == pytest.approx([reference[s] for s in range(1, STEPS + 1)],
                                                                      rel=1e-6)
    assert json.loads((run / "summary.json").read_text())["resumed_from"] == 2

    before = _snapshot(run)  # a resume of the finished run reports it and changes nothing
    proc = _one_process(root, "faulty", "--resume")
    assert proc.returncode == 0 and "already finished its 8 steps" in proc.stderr, proc.stderr[-3000:]
    assert _snapshot(run) == before
