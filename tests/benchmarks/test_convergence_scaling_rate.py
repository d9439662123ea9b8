"""Amendment 7's rate-factor rule: gaps to LAMB's chosen final per cell, the lowest mean chooses, a tie keeps 1, and a
missing or mismatched probe record names the command that makes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.convergence.scaling_rate import Cell, choose_factor, plot_rate, rate_study


def _cell(root: Path, *, model: str, tokens: int, lamb_lr: float, lamb_final: float,
          kfac_finals: dict[float, float]) -> Cell:
    cell = Cell(model_size=model, tokens=tokens, results=root / f"scaling_{model}")
    folder = cell.results / f"b{tokens}"
    (folder / "tune").mkdir(parents=True)
    finals = {f"{lamb_lr:g}": lamb_final, f"{lamb_lr * 2:g}": lamb_final + 1.0}
    (folder / "chosen.json").write_text(json.dumps({"lamb": {"lr": lamb_lr}, "finals": finals}))
    for c, final in kfac_finals.items():
        spec = {"eval_part": "tune", "seed": 0, "kfac": {}, "lr": lamb_lr * c}
        cell.probe_path(c).write_text(json.dumps({"spec": spec, "final": final}))
    return cell


def test_the_lowest_mean_gap_chooses_over_cells_not_the_best_single_cell(tmp_path: Path) -> None:
    # cell a favours 0.25 a little, cell b favours 0.5 a lot: the mean picks 0.5
    a = _cell(tmp_path, model="tiny", tokens=2048, lamb_lr=0.01, lamb_final=2.5,
              kfac_finals={0.25: 2.4, 0.5: 2.45, 1.0: 2.6})
    b = _cell(tmp_path, model="mini", tokens=8192, lamb_lr=0.02, lamb_final=3.5,
              kfac_finals={0.25: 4.8, 0.5: 3.6, 1.0: 5.7})
    result = rate_study([a, b])
    assert result["choice"] == 0.5
    assert result["mean_gap"]["0.5"] == pytest.approx(((2.45 - 2.5) + (3.6 - 3.5)) / 2)
    assert result["cells"]["mini/b8192"]["gap"]["1"] == pytest.approx(2.2)
    assert result["cells"]["tiny/b2048"]["records"][0] == "scaling_tiny/b2048/tune/kfac_defaults_lrx0.25.json"
    assert plot_rate(result, tmp_path / "rate.png").stat().st_size > 0


def test_a_mean_within_the_tie_of_factor_one_keeps_today_defaults() -> None:
    gaps = {"x": {0.25: 0.30, 0.5: 0.10, 1.0: 0.115}}
    assert choose_factor(gaps) == (1.0, pytest.approx({0.25: 0.30, 0.5: 0.10, 1.0: 0.115}))
    gaps = {"x": {0.25: 0.30, 0.5: 0.10, 1.0: 0.125}}
    assert choose_factor(gaps)[0] == 0.5


def test_a_missing_or_mismatched_probe_names_the_fix(tmp_path: Path) -> None:
    cell = _cell(tmp_path, model="mini", tokens=32768, lamb_lr=0.01, lamb_final=3.2,
                 kfac_finals={0.25: 4.0, 1.0: 5.7})
    with pytest.raises(SystemExit, match=r"kfac_defaults_lrx0\.5\.json is missing.*--model-size mini --batches 32768 "
                                         r"--kfac-lr-scale 0\.5"):
        rate_study([cell])
    cell.probe_path(0.5).write_text(json.dumps({"spec": {"eval_part": "report", "seed": 0, "kfac": {}, "lr": 0.005},
                                                "final": 3.9}))
    with pytest.raises(SystemExit, match=r"not the rule's probe.*eval_part"):
        rate_study([cell])
    cell.probe_path(0.5).write_text(json.dumps({"spec": {"eval_part": "tune", "seed": 0, "kfac": {}, "lr": 0.01},
                                                "final": 3.9}))
    with pytest.raises(SystemExit, match=r"not the rule's probe.*'lr': 0\.01"):
        rate_study([cell])


def test_the_rate_stage_takes_no_probe_options(tmp_path: Path) -> None:
    from benchmarks.convergence.cli import main

    with pytest.raises(SystemExit, match=r"--stage rate reads both models' recorded probes"):
        main(["scaling", "--stage", "rate", "--results", str(tmp_path), "--kfac-lr-scale", "0.5"])


def test_the_rate_stage_reproduces_the_committed_choice_from_the_records_alone(tmp_path: Path) -> None:
    from benchmarks.convergence.cli import main

    convergence = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "convergence"
    committed = json.loads((convergence / "scaling_rate.json").read_text())
    for study in ("scaling", "scaling_mini"):
        for chosen in (convergence / study).glob("b*/chosen.json"):
            folder = tmp_path / study / chosen.parent.name
            (folder / "tune").mkdir(parents=True)
            (folder / "chosen.json").write_text(chosen.read_text())
            for probe in (chosen.parent / "tune").glob("kfac_defaults*.json"):
                (folder / "tune" / probe.name).write_text(probe.read_text())
    result = main(["scaling", "--stage", "rate", "--results", str(tmp_path)])
    assert result["choice"] == committed["choice"] and result["mean_gap"] == committed["mean_gap"]
    assert result["cells"] == committed["cells"]
    assert (tmp_path / "scaling_rate.png").stat().st_size > 10_000
