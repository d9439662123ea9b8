"""The scaling study's diagnostic probe (amendment 6): K-FAC's defaults on the tune part with the tuning seed, at LAMB's
chosen rate times a factor, recorded beside LAMB's grid and never mixed into the report; and the decomposition
interval a run's record keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.convergence.regimes import LIBRARY_DEFAULTS
from benchmarks.convergence.runner import TUNE_SEED, kfac_interval
from benchmarks.convergence.scaling import RULE, Study
from benchmarks.convergence.scaling_probe import probe


def _study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Study, Any, list[Any]]:
    regime = RULE.regime_for(8192, steps=373, model_size="mini")
    study = Study(parts=None, vocab=tmp_path, work=tmp_path, results=tmp_path, machine={})  # type: ignore[arg-type]
    ran: list[Any] = []

    def fake_run(spec: Any, regime: Any) -> dict[str, Any]:  # nothing trains: the spec is what is checked
        ran.append(spec)
        return {"spec": {"name": spec.name, "lr": spec.lr}, "final": 4.2, "kfac_interval": 30}

    monkeypatch.setattr(Study, "run", lambda self, spec, regime: fake_run(spec, regime))
    return study, regime, ran


def test_a_probe_runs_the_defaults_on_the_tune_part_at_a_factor_of_lambs_chosen_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study, regime, ran = _study(tmp_path, monkeypatch)
    (tmp_path / regime.name).mkdir()
    (tmp_path / regime.name / "chosen.json").write_text(json.dumps({"lamb": {"lr": 0.01},
                                                                    "finals": {"0.01": 3.5, "0.005": 4.8}}))
    out = probe(study, regime, lr_scale=0.5, kfac={"inv_update_steps": 10})
    (spec,) = ran
    assert (spec.optimizer, spec.eval_part, spec.seed) == (LIBRARY_DEFAULTS, "tune", TUNE_SEED)
    assert spec.lr == pytest.approx(0.005) and spec.kfac == {"inv_update_steps": 10}
    assert spec.name == "kfac_defaults_lrx0.5_inv_update_steps10" and spec.steps == regime.steps
    assert out["lamb_finals"] == {"0.01": 3.5, "0.005": 4.8} and out["kfac_interval"] == 30
    probe(study, regime)  # no change: the defaults at LAMB's rate, their own record name
    assert ran[-1].name == "kfac_defaults" and ran[-1].lr == pytest.approx(0.01) and ran[-1].kfac == {}


def test_a_probe_before_lambs_tuning_or_at_a_bad_factor_names_the_fix(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    study, regime, ran = _study(tmp_path, monkeypatch)
    with pytest.raises(SystemExit, match=r"chosen\.json is missing.*--stage tune"):
        probe(study, regime, lr_scale=0.5)
    with pytest.raises(SystemExit, match=r"--kfac-lr-scale -1\.0"):
        probe(study, regime, lr_scale=-1.0)
    assert ran == []


def test_a_record_keeps_the_interval_in_force_at_the_end_and_none_for_lamb() -> None:
    rows = [{"step": 1, "kfac": {"inv_update_steps": 10}}, {"step": 2}, {"step": 3, "kfac": {"inv_update_steps": 30}}]
    assert kfac_interval(rows) == 30
    assert kfac_interval([{"step": 1, "loss": 5.0}]) is None


def test_the_probes_options_on_another_stage_are_refused_not_ignored(tmp_path: Path) -> None:
    from benchmarks.convergence.cli import main

    with pytest.raises(SystemExit, match=r"--kfac-lr-scale: only --stage probe.*--stage report"):
        main(["scaling", "--stage", "report", "--text", str(tmp_path / "absent.txt"), "--kfac-lr-scale", "0.5"])


def test_a_probe_of_a_list_or_schedule_value_gets_a_file_safe_name() -> None:
    """The record and the run folder are named after the probe: a schedule or a list value must not put spaces,
    quotes or braces into a path (the shell, the launcher's arguments and a reader's glob all trip on them)."""
    from benchmarks.convergence.scaling_probe import probe_name

    name = probe_name(lr_scale=1.0, kfac={"relative_damping": {"initial": 1000, "milestones": [120], "factor": 0.01},
                                          "skip_layers": ["embeddings"]})
    assert name == "kfac_defaults_relative_dampinginitial1000milestones120factor0.01_skip_layersembeddings"
    assert probe_name(lr_scale=0.5, kfac={"compute_method": "eigen-adaptive"}) == \
        "kfac_defaults_lrx0.5_compute_methodeigen-adaptive"
