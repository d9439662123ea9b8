"""benchmarks.mission_seeds: the main job's reports of several seeds in one table, with spreads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.mission_seeds import main, markdown, summarise

SETTINGS = {"model": "tiny", "phase1_steps": 4, "data": "built-in"}


def _variant(*, final: float, seconds: float, steps: int, to_final: float | None, to_best: float | None = None,
             f1: float) -> dict[str, Any]:
    return {"final_heldout_mlm": final, "phase1_train_seconds": seconds, "phase1_steps": steps, "squad_f1": f1,
            "time_ratio_to_lamb_final": to_final, "step_ratio_to_lamb_final": to_final,
            "time_ratio_to_lamb_best": to_best if to_best is not None else to_final,
            "heldout_curve": {"steps": [2, steps], "seconds": [seconds / 2, seconds], "values": [final + 1, final]}}


def _report(folder: Path, *, seed: int | None, lamb_final: float, kfac_final: float, to_final: float | None,
            kfac_seconds: float = 12.0, settings: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True)
    data = {"settings": {**(settings or SETTINGS), **({} if seed is None else {"seed": seed})},
            "target": {"final_heldout_mlm": lamb_final},
            "variants": {"lamb": _variant(final=lamb_final, seconds=10.0, steps=4, to_final=1.0, f1=80.0),
                         "kfac": _variant(final=kfac_final, seconds=kfac_seconds, steps=4, to_final=to_final,
                                          f1=70.0 + seed if seed is not None else 70.0)}}
    (folder / "report.json").write_text(json.dumps(data))
    return folder


def test_spreads_count_the_seeds_that_never_reach_lambs_final(tmp_path: Path) -> None:
    runs = [_report(tmp_path / "s0", seed=0, lamb_final=2.0, kfac_final=2.5, to_final=None),
            _report(tmp_path / "s1", seed=1, lamb_final=2.2, kfac_final=2.0, to_final=0.5),
            _report(tmp_path / "s2", seed=2, lamb_final=2.4, kfac_final=2.3, to_final=0.7)]
    out = summarise(runs)
    assert [r["seed"] for r in out["seeds"]] == [0, 1, 2]
    assert out["reached_lamb_final"] == "2 of 3"
    # a mean of the seeds that reached it would hide the one that never did: no mean is given then
    assert out["spread"]["time_ratio_to_lamb_final"]["mean"] is None
    assert out["spread"]["time_ratio_to_lamb_final"]["missing"] == 1
    assert out["spread"]["kfac_minus_lamb"]["mean"] == pytest.approx((0.5 - 0.2 - 0.1) / 3)
    assert out["seeds"][0]["cost_per_step"] == pytest.approx(1.2)
    assert out["spread"]["squad_f1_kfac"]["mean"] == pytest.approx(71.0)


def test_a_mean_time_ratio_when_every_seed_reaches_it(tmp_path: Path) -> None:
    runs = [_report(tmp_path / f"s{s}", seed=s, lamb_final=2.0, kfac_final=1.9, to_final=r)
            for s, r in ((0, 0.6), (1, 0.8))]
    out = summarise(runs)
    assert out["reached_lamb_final"] == "2 of 2"
    assert out["spread"]["time_ratio_to_lamb_final"]["mean"] == pytest.approx(0.7)


def test_runs_with_other_settings_are_refused_naming_the_key(tmp_path: Path) -> None:
    runs = [_report(tmp_path / "a", seed=0, lamb_final=2.0, kfac_final=2.5, to_final=None),
            _report(tmp_path / "b", seed=1, lamb_final=2.0, kfac_final=2.5, to_final=None,
                    settings={**SETTINGS, "phase1_steps": 8})]
    with pytest.raises(ValueError, match=r"phase1_steps.*b"):
        summarise(runs)


def test_the_same_seed_twice_is_refused(tmp_path: Path) -> None:
    runs = [_report(tmp_path / d, seed=0, lamb_final=2.0, kfac_final=2.5, to_final=None) for d in ("a", "b")]
    with pytest.raises(ValueError, match="seed 0"):
        summarise(runs)


def test_a_report_without_its_seed_is_refused(tmp_path: Path) -> None:
    runs = [_report(tmp_path / "old", seed=None, lamb_final=2.0, kfac_final=2.5, to_final=None)]
    with pytest.raises(ValueError, match=r"old.*seed"):
        summarise(runs)


def test_a_missing_report_names_the_file_and_the_command(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"absent/report.json.*python -m mission"):
        main([str(tmp_path / "absent"), "--out", str(tmp_path / "out")])


def test_main_writes_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_report(tmp_path / f"s{s}", seed=s, lamb_final=2.0 + s / 10, kfac_final=2.3, to_final=None)
            for s in (0, 1)]
    main([*map(str, runs), "--out", str(tmp_path / "out")])
    table = (tmp_path / "out" / "seeds.md").read_text()
    assert "never" in table and "0 of 2" in table
    assert json.loads((tmp_path / "out" / "seeds.json").read_text())["reached_lamb_final"] == "0 of 2"
    assert (tmp_path / "out" / "seeds_heldout.png").stat().st_size > 10_000
    assert "0 of 2" in capsys.readouterr().out


def test_a_run_without_a_held_out_loss_is_shown_as_missing_not_as_never(tmp_path: Path) -> None:
    """A K-FAC run that recorded no held-out loss (killed before its first evaluation) once raised a TypeError."""
    folder = _report(tmp_path / "s0", seed=0, lamb_final=2.0, kfac_final=2.5, to_final=None)
    data = json.loads((folder / "report.json").read_text())
    data["variants"]["kfac"]["final_heldout_mlm"] = None
    (folder / "report.json").write_text(json.dumps(data))
    out = summarise([folder])
    assert out["seeds"][0]["kfac_minus_lamb"] is None and out["spread"]["kfac_minus_lamb"]["missing"] == 1
    row = next(line for line in markdown(out).splitlines() if line.startswith("| 0 |"))
    assert row.split("|")[3].strip() == ""  # kfac_final: blank, while the ratios say never
    assert row.split("|")[5].strip() == "never"


def test_the_command_refuses_mismatched_runs_with_a_usage_error(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_report(tmp_path / d, seed=0, lamb_final=2.0, kfac_final=2.5, to_final=None) for d in ("a", "b")]
    with pytest.raises(SystemExit) as exit_info:
        main([*map(str, runs), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "seed 0 twice" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
