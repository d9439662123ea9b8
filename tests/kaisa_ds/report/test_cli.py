"""python -m kaisa_ds.report: PNG plots from the diagnostics a run logged, clear errors otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kaisa_ds import KFACPreconditioner
from kaisa_ds.report.cli import kfac_rows, main
from tests.support.models import TinyTransformerish


def _run_dir(tmp_path: Path, steps: int = 6) -> Path:
    """A run folder whose metrics.jsonl holds what bert_pretrain logs: a row per step with ``kfac``."""
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, inv_update_steps=2, kl_clip=1e-6, lr=0.1)
    lines = []
    for step in range(1, steps + 1):
        model.zero_grad()
        F.mse_loss(model(torch.randint(0, 11, (4, 5))), torch.randn(4, 5, 5)).backward()
        precond.step()
        lines.append(json.dumps({"step": step, "loss": 1.0, "kfac": precond.diagnostics_snapshot()}))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 7, "lo')  # torn by a kill
    return tmp_path


def test_report_plots_every_logged_step(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    rows = kfac_rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["decomposition_age"] for r in rows] == [1, 2, 1, 2, 1, 2]  # decompositions at steps 0, 2, 4
    assert all(0 < r["kl_scale"] < 1 for r in rows)
    assert main([str(run)]) == 0
    png = run / "kfac_diagnostics.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"


def test_a_run_without_kfac_or_without_metrics_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "no K-FAC diagnostics" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "absent")])
    assert "metrics.jsonl does not exist" in capsys.readouterr().err


def test_effectiveness_is_plotted_and_old_logs_still_plot(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    rows = kfac_rows(run / "metrics.jsonl")
    assert all(r["effectiveness"]["out"]["cosine"] <= 1 for r in rows) and rows[0]["damping_mode"] is None
    old = tmp_path / "old"
    old.mkdir()
    legacy = [{k: v for k, v in r.items() if k not in ("effectiveness", "damping_mode", "unpreconditioned_layers")}
              for r in rows]  # metrics.jsonl written before the effectiveness check
    (old / "metrics.jsonl").write_text("".join(json.dumps({"step": r["step"], "kfac": r}) + "\n" for r in legacy))
    assert main([str(old)]) == 0 and (old / "kfac_diagnostics.png").is_file()


def test_report_prints_the_coverage_the_run_logged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path, steps=2)
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "K-FAC preconditions 227 of 227 trainable parameters (100.0%" in out  # TinyTransformerish: 5 layers
    assert "Linear" in out and "Embedding" in out
