"""Amendment 9's rule: one-sided rotation becomes the default only if its mean gap to LAMB over the cells is at most
0.05 nats above the defaults', no cell stays on the plateau where the defaults leave it, and its overhead is at most
two thirds of the defaults'; the cost runs read are the ones the rule names; the committed choice is rebuilt from the
committed records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.convergence.scaling_one_sided import CANDIDATE, decide, one_sided_study, read_overhead
from benchmarks.convergence.scaling_rate import both_models_cells
from tests.support.records import committed_choice

CHEAPER = {"defaults": 0.30, "candidate": 0.15}


def _cells(**finals: tuple[float, float]) -> dict:
    return {name: {"lamb": 3.0, "early": 5.5, "defaults": d, "candidate": c} for name, (d, c) in finals.items()}


def test_the_candidate_may_be_worse_by_the_margin_but_no_more() -> None:
    assert decide(_cells(a=(3.0, 3.08), b=(3.0, 3.0)), CHEAPER)[0] is True  # mean gap up by 0.04
    chosen, why = decide(_cells(a=(3.0, 3.12), b=(3.0, 3.0)), CHEAPER)  # up by 0.06
    assert not chosen and "more than 0.05 nats above" in why


def test_the_candidate_must_cut_the_overhead_by_a_third() -> None:
    same = _cells(a=(3.0, 3.0))
    assert decide(same, {"defaults": 0.30, "candidate": 0.19})[0] is True  # under 2/3
    chosen, why = decide(same, {"defaults": 0.30, "candidate": 0.21})
    assert not chosen and "overhead" in why


def test_a_cell_left_on_the_plateau_vetoes_whatever_the_mean() -> None:
    chosen, why = decide(_cells(a=(5.0, 5.7), b=(5.8, 3.0)), CHEAPER)  # mean far better, but a stays on the plateau
    assert not chosen and "['a']" in why


def _cost_run(path: Path, *, kfac_set: list, **settings: object) -> Path:
    base = {"size": "mini", "batch": 32, "seq": 64, "optimizer": "lamb", "steps": 150, "device": "cpu"}
    path.write_text(json.dumps({"settings": {**base, **settings, "kfac_set": kfac_set}, "overhead": 0.2}))
    return path


def test_only_the_rules_cost_run_is_read(tmp_path: Path) -> None:
    ok = _cost_run(tmp_path / "ok.json", kfac_set=[["max_factor_ratio", 2]])
    assert read_overhead(ok, kfac=CANDIDATE) == 0.2
    with pytest.raises(SystemExit, match="kfac_set"):  # the defaults' run handed in as the candidate's
        read_overhead(_cost_run(tmp_path / "d.json", kfac_set=[]), kfac=CANDIDATE)
    with pytest.raises(SystemExit, match="batch"):
        read_overhead(_cost_run(tmp_path / "b.json", kfac_set=[], batch=64), kfac={})
    with pytest.raises(SystemExit, match="default_overhead"):
        read_overhead(tmp_path / "missing.json", kfac={})


def test_the_committed_choice_follows_from_the_committed_records() -> None:
    root, committed = committed_choice("scaling_one_sided.json", what="amendment 9's cells")
    rebuilt = one_sided_study(both_models_cells(root), cost_folder=root.parent / "one_sided")
    assert rebuilt["chosen"] == committed["chosen"]
    assert rebuilt["mean_gap"] == pytest.approx(committed["mean_gap"])
    assert rebuilt["overhead"] == pytest.approx(committed["overhead"])
