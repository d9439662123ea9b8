"""The batch-scaling study: its rule's arithmetic (lengths, grids, the batch list, per-batch shapes), the critical
batch fit and its bootstrap on points of known ``S_min`` and ``B_crit``, and (slow) the toy-scale stages end to end
through bert_pretrain: plan, per-batch LAMB tuning, report pairs, fit and plot."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks.convergence import scaling_fit
from benchmarks.convergence.runner import noise_curve
from benchmarks.convergence.scaling import RULE, noise_at
from benchmarks.convergence.scaling_fit import bootstrap_interval, fit_critical_batch, ratio_interval
from benchmarks.convergence.scaling_plots import plot_scaling
from bert_pretrain.data.documents import DataError

RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "convergence" / "scaling"


def test_the_fit_recovers_a_known_critical_batch() -> None:
    s_min, b_crit = 200.0, 8000.0
    points = [(b, s_min * (1 + b_crit / b)) for b in (2048, 4096, 8192, 16384, 32768, 65536)]
    fitted = fit_critical_batch(points)
    assert fitted is not None and fitted[0] == pytest.approx(s_min) and fitted[1] == pytest.approx(b_crit)
    assert fit_critical_batch(points[:1] * 3) is None  # one batch: no slope to fit


def test_the_bootstrap_interval_holds_its_coverage_with_two_seeds_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 synthetic studies of known B_crit (5% noise on each seed's steps, 2 seeds at 6 batches): the 95% interval
    must cover the truth in at least 85 (resampling each batch's seeds alone covered 75–82)."""
    monkeypatch.setattr(scaling_fit, "BOOTSTRAP", 400)
    covered = 0
    for trial in range(100):
        rng = random.Random(trial)
        study = {b: [200 * (1 + 8000 / b) * (1 + rng.gauss(0, 0.05)) for _ in range(2)]
                 for b in (2048, 4096, 8192, 16384, 32768, 65536)}
        got = bootstrap_interval(study, seed=trial)
        low, high = got["b_crit_interval"]
        assert low < got["b_crit_tokens"] < high
        covered += low < 8000 < high
    assert covered >= 85, covered


def test_the_ratio_of_two_critical_batches_has_an_interval_around_it() -> None:
    rng = random.Random(3)

    def fitted(b_crit: float) -> dict[str, Any]:
        return bootstrap_interval({b: [200 * (1 + b_crit / b) * (1 + rng.gauss(0, 0.03)) for _ in range(2)]
                                   for b in (2048, 4096, 8192, 16384, 32768, 65536)}, seed=int(b_crit))

    got = ratio_interval(fitted(16000), fitted(8000))
    assert got["ratio"] == pytest.approx(2, rel=0.25)
    low, high = got["interval"]
    assert 1 < low < got["ratio"] < high
    assert ratio_interval({"b_crit_tokens": None}, fitted(8000)) == {"ratio": None, "interval": None}


def test_run_lengths_follow_the_noise_scale_model_anchored_at_the_smallest_batch() -> None:
    base, noise = 1000.0, 6144.0  # S_min = 1000 / (1 + 3) = 250
    steps = [RULE.steps_for(b, base_steps=base, noise_tokens=noise) for b in RULE.batches]
    assert steps[0] == RULE.base_steps
    assert steps[1] == pytest.approx(1.5 * 250 * (1 + noise / 4096), abs=1)
    assert steps[1:] == sorted(steps[1:], reverse=True) and steps[-1] > 1.5 * 250  # falls towards 1.5 S_min


def test_the_batch_list_grows_until_two_batches_lie_above_the_noise_scale() -> None:
    assert RULE.batches_above(10_000) == RULE.batches
    assert RULE.batches_above(50_000) == (*RULE.batches, 131072)
    assert RULE.batches_above(200_000)[-2:] == (262144, 524288)


def test_each_batch_is_sequences_over_two_ranks_with_capped_passes_and_a_sqrt_scaled_grid() -> None:
    for tokens in RULE.batches:
        regime = RULE.regime_for(tokens, steps=300)
        assert regime.global_batch * regime.seq == tokens and regime.micro_batch <= RULE.max_micro
    big = RULE.regime_for(65536, steps=300)
    assert (big.micro_batch, big.gas) == (64, 8)
    assert big.lamb_lrs == pytest.approx((0.5 * 0.01 * 32**0.5, 0.01 * 32**0.5, 2 * 0.01 * 32**0.5), rel=1e-4)
    assert RULE.regime_for(2048, steps=1500).lamb_lrs == (0.005, 0.01, 0.02)
    with pytest.raises(ValueError, match="whole number"):
        RULE.regime_for(1000, steps=10)
    assert RULE.seeds_for(65536, RULE.batches) == (1, 2, 3) and RULE.seeds_for(8192, RULE.batches) == (1, 2)


def test_the_noise_scale_is_read_where_the_run_reached_the_target() -> None:
    rows: list[dict[str, Any]] = [{"step": 10, "noise_scale": {"b_simple": 50.0}}, {"step": 15},
            {"step": 20, "kfac": {"noise_scale": {"b_simple": 70.0}}}, {"step": 30, "noise_scale": None}]
    curve = noise_curve(rows)  # a LAMB run's probe and a K-FAC run's diagnostics alike
    assert curve == {"steps": [10.0, 20.0], "values": [50.0, 70.0]}
    record = {"noise_curve": curve}
    assert noise_at(record, step=25) == 70.0 and noise_at(record, step=12) == 50.0
    assert noise_at(record, step=3) == 50.0  # before the first measurement: the first one
    assert noise_at({"noise_curve": {"steps": [], "values": []}}, step=5) is None


def test_the_plot_draws_every_batch_from_a_summary(tmp_path: Path) -> None:
    targets = [5.3, 4.6]

    def runs(scale: float) -> list[dict[str, Any]]:
        return [{"targets": {f"{t:.4f}": {"step": scale * (1 + i), "seconds": scale * 2} for i, t in
                             enumerate(targets)}, "seconds_per_step": 1.0} for _ in range(2)]

    per_batch = {str(b): {"runs": {"lamb": runs(1e6 / b + 100), "kfac": runs(8e5 / b + 80)},
                          "kfac_step_overhead": 0.05} for b in (2048, 8192, 32768)}
    fits = {opt: {f"{t:.4f}": {"s_min": 100.0, "b_crit_tokens": 5000.0} for t in targets} for opt in ("lamb", "kfac")}
    out = tmp_path / "scaling.png"
    plot_scaling({"targets": targets, "per_batch": per_batch, "fits": fits, "noise_tokens": 7000.0}, out=out)
    assert out.stat().st_size > 20_000


def test_the_plot_marks_a_batch_where_a_seed_never_reached_the_target() -> None:
    from benchmarks.convergence.scaling_plots import not_reached

    def run(step: float | None) -> dict[str, Any]:
        return {"targets": {"4.8588": {"step": step, "seconds": None if step is None else 2 * step}}}

    per_batch = {2048: {"runs": {"kfac": [run(400.0), run(420.0)], "lamb": [run(500.0)]}},
                 8192: {"runs": {"kfac": [run(None), run(150.0)], "lamb": [run(240.0)]}},
                 32768: {"runs": {"kfac": [], "lamb": [run(170.0)]}}}  # not run yet: no mark
    assert not_reached(per_batch, "kfac", "4.8588") == [8192]
    assert not_reached(per_batch, "lamb", "4.8588") == []


def committed_records(tmp_path: Path) -> Path:
    """The study's committed records, where their data caches (runs/scaling/data, a work folder) do not exist."""
    copy = tmp_path / "scaling"
    shutil.copytree(RECORDS, copy, ignore=shutil.ignore_patterns("*.png"))
    record = json.loads((copy / "b2048" / "report" / "lamb_lr0.01_seed1.json").read_text())
    record["eval_cache"] = str(tmp_path / "absent_cache" / Path(record["eval_cache"]).name)
    (copy / "b2048" / "report" / "lamb_lr0.01_seed1.json").write_text(json.dumps(record))
    return copy


def test_the_fit_reproduces_the_committed_summary_from_the_records_alone(tmp_path: Path) -> None:
    from benchmarks.convergence.cli import main

    results = committed_records(tmp_path)
    (results / "summary.json").unlink()
    summary = main(["scaling", "--stage", "fit", "--results", str(results)])
    committed = json.loads((RECORDS / "summary.json").read_text())
    assert summary["plateau"] == committed["plateau"]
    assert summary["kfac_to_lamb_critical_batch"] == committed["kfac_to_lamb_critical_batch"]
    assert summary["per_batch"] == committed["per_batch"]
    assert (results / "scaling.png").stat().st_size > 20_000


def test_the_fit_without_a_recorded_plateau_or_its_cache_names_the_file_and_the_fix(tmp_path: Path) -> None:
    from benchmarks.convergence.cli import main

    results = committed_records(tmp_path)
    (results / "plateaus.json").unlink()
    with pytest.raises(DataError, match=r"plateaus\.json.*absent_cache.*rerun the stage"):
        main(["scaling", "--stage", "fit", "--results", str(results)])


@pytest.mark.slow  # ~4 min: 15 launches of bert_pretrain
def test_quick_stages_end_to_end(tmp_path: Path) -> None:
    from benchmarks.convergence.cli import main

    text = tmp_path / "corpus.txt"
    common = ["--text", str(text), "--quick", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "res")]
    main(["scaling", "--stage", "text", *common])
    assert text.read_text().count("\n\n") > 250  # the articles of the toy world
    plan = main(["scaling", "--stage", "plan", *common])
    assert list(plan["batches"][:3]) == [128, 256, 512] and plan["steps"]["128"] == 12 and plan["noise_tokens"] > 0
    main(["scaling", "--stage", "tune", *common])
    main(["scaling", "--stage", "report", *common])
    summary = main(["scaling", "--stage", "fit", *common])
    assert set(summary["per_batch"]) == {str(b) for b in plan["batches"]}
    for tokens in plan["batches"]:
        chosen = json.loads((tmp_path / "res" / f"b{tokens}" / "chosen.json").read_text())
        assert chosen["lamb"]["lr"] in chosen["regime"]["lamb_lrs"]
        for record in (tmp_path / "res" / f"b{tokens}" / "report").glob("*.json"):
            got = json.loads(record.read_text())
            assert got["spec"]["eval_part"] == "report" and got["data_tokens"] > 0
    assert (tmp_path / "res" / "scaling.png").stat().st_size > 20_000


def _study_with_finals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, finals: dict[float, float],
                       tried: tuple[float, ...]) -> tuple[Any, Any, list[float]]:
    """A study whose LAMB tune runs end at ``finals[lr]``, with ``tried`` already in its ``chosen.json``; the rates it
    trains are listed in the third value (a run is a lookup: nothing trains)."""
    from benchmarks.convergence.scaling import Study

    regime = RULE.regime_for(32768, steps=243)
    study = Study(parts=None, vocab=tmp_path, work=tmp_path, results=tmp_path, machine={})  # type: ignore[arg-type]
    ran: list[float] = []

    def fake_run(spec: Any, regime: Any) -> dict[str, Any]:
        ran.append(spec.lr)
        return {"spec": {"eval_part": spec.eval_part, "lr": spec.lr}, "final": finals[spec.lr]}

    monkeypatch.setattr(Study, "run", lambda self, spec, regime: fake_run(spec, regime))
    (tmp_path / regime.name).mkdir(parents=True)
    chosen = {"lamb": {"lr": min(tried, key=lambda lr: finals[lr])}, "edges": ["..."],
              "finals": {f"{lr:g}": finals[lr] for lr in tried}}
    (tmp_path / regime.name / "chosen.json").write_text(json.dumps(chosen))
    return study, regime, ran


def test_a_choice_at_the_grids_edge_extends_the_grid_beyond_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """At 32,768 tokens LAMB chose 0.02, the smallest of 0.02 / 0.04 / 0.08: amendment 4 tries 0.01, and 0.005 when
    0.01 is better still, and stops where the choice is inside the grid."""
    finals = {0.005: 4.3, 0.01: 4.1, 0.02: 4.35, 0.04: 5.5, 0.08: 5.8}
    study, regime, ran = _study_with_finals(tmp_path, monkeypatch, finals, (0.02, 0.04, 0.08))
    chosen = study.extend_edge(regime)
    assert chosen["lamb"] == {"lr": 0.01} and chosen["previous"] == {"lr": 0.02} and chosen["edges"] == []
    assert sorted(ran) == [0.005, 0.01, 0.02, 0.04, 0.08]
    assert json.loads((tmp_path / regime.name / "chosen.json").read_text())["lamb"] == {"lr": 0.01}


def test_an_inside_choice_or_a_worse_point_beyond_keeps_the_choice(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    finals = {0.01: 4.5, 0.02: 4.35, 0.04: 5.5, 0.08: 5.8}
    study, regime, ran = _study_with_finals(tmp_path, monkeypatch, finals, (0.02, 0.04, 0.08))
    assert study.extend_edge(regime)["lamb"] == {"lr": 0.02} and 0.01 in ran  # tried, worse: 0.02 is inside now
    study, regime, ran = _study_with_finals(tmp_path / "b", monkeypatch, finals, (0.01, 0.02, 0.04))
    assert study.extend_edge(regime)["lamb"] == {"lr": 0.02} and sorted(ran) == [0.01, 0.02, 0.04]


def test_a_moved_choice_leaves_out_the_runs_made_at_the_old_rate(tmp_path: Path) -> None:
    """K-FAC's report records are named by seed, not rate: once amendment 4 moves a batch's LAMB rate, the fit must
    not pair LAMB's new rate with K-FAC runs made at the old one."""
    from benchmarks.convergence.scaling import Recorded, load_plan
    from benchmarks.convergence.scaling_fit import load_batch

    results = committed_records(tmp_path)
    recorded = Recorded(results=results, machine={})
    plan = load_plan(results / "plan.json")
    assert [len(v) for v in load_batch(recorded, plan, 32768).values()] == [3, 3]
    chosen = json.loads((results / "b32768" / "chosen.json").read_text())
    chosen["lamb"] = {"lr": 0.01}
    (results / "b32768" / "chosen.json").write_text(json.dumps(chosen))
    assert load_batch(recorded, plan, 32768) == {"lamb": [], "kfac": []}


def test_bert_minis_third_seed_goes_to_the_two_largest_of_its_own_batches(tmp_path: Path) -> None:
    """BERT-mini's plan lists the rule's six batches, but amendment 5 studies three (2,048, 8,192, 32,768): the rule's
    third seed belongs to 8,192 and 32,768, and the fit must read a seed-3 record at 8,192."""
    from benchmarks.convergence.scaling import Recorded, load_plan
    from benchmarks.convergence.scaling_fit import load_batch

    results = tmp_path / "scaling_mini"
    shutil.copytree(RECORDS.parent / "scaling_mini", results, ignore=shutil.ignore_patterns("*.png"))
    report = results / "b8192" / "report"
    for name in ("lamb_lr0.01", "kfac_defaults"):
        shutil.copy(report / f"{name}_seed2.json", report / f"{name}_seed3.json")
    recorded = Recorded(results=results, machine={}, model_size="mini")
    plan = load_plan(results / "plan.json")
    assert [len(v) for v in load_batch(recorded, plan, 8192).values()] == [3, 3]
    assert [len(v) for v in load_batch(recorded, plan, 2048).values()] == [2, 2]


def test_a_stage_without_batches_runs_the_models_studied_batches() -> None:
    """``--stage report --model-size mini`` with no ``--batches`` ran all six of the plan's batches, three of them
    never part of BERT-mini's study (hours of runs no fit reads)."""
    import argparse

    from benchmarks.convergence.scaling import QUICK, Plan, load_plan
    from benchmarks.convergence.scaling_cli import chosen_batches

    plan = load_plan(RECORDS.parent / "scaling_mini" / "plan.json")
    assert chosen_batches(plan, argparse.Namespace(batches=None, model_size="mini", quick=False)) == (2048, 8192, 32768)
    assert chosen_batches(plan, argparse.Namespace(batches=None, model_size="tiny", quick=False)) == plan.batches
    assert chosen_batches(plan, argparse.Namespace(batches=[8192], model_size="mini", quick=False)) == (8192,)
    # the smoke test's toy rule has no 8,192 tokens: BERT-mini there studies the toy plan's batches, not none
    toy = Plan(base_lr=0.01, base_steps_to_late=10.0, noise_tokens=100.0, batches=QUICK.batches,
               steps={str(b): 12 for b in QUICK.batches})
    assert chosen_batches(toy, argparse.Namespace(batches=None, model_size="mini", quick=True)) == QUICK.batches
    assert QUICK.seeds_for(512, toy.batches, model_size="mini") == QUICK.largest_seeds


def test_a_candidates_report_reruns_both_runs_of_each_pair_into_its_own_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Amendment 9's reruns: the candidate's keys reach K-FAC's run, LAMB's twin runs again beside it (the same day,
    so the pair's times compare), and neither touches today's defaults' records in ``report/``."""
    from benchmarks.convergence import scaling
    from benchmarks.convergence.scaling import Study

    regime = RULE.regime_for(2048, steps=100)
    (tmp_path / regime.name).mkdir()
    (tmp_path / regime.name / "chosen.json").write_text(json.dumps({"lamb": {"lr": 0.01}}))
    ran: list[tuple[Path, Any]] = []

    def fake_run(spec: Any, regime: Any, parts: Any, **kw: Any) -> dict[str, Any]:
        ran.append((kw["record"], spec.kfac))
        return {}

    monkeypatch.setattr(scaling, "run", fake_run)
    for candidate in ({}, {"max_factor_ratio": 2}):
        Study(parts=None, vocab=tmp_path, work=tmp_path, results=tmp_path, machine={},  # type: ignore[arg-type]
              candidate=candidate).report(regime, seeds=(1,))
    folder = tmp_path / regime.name
    assert ran == [(folder / "report" / "lamb_lr0.01_seed1.json", None),
                   (folder / "report" / "kfac_defaults_seed1.json", {}),
                   (folder / "report_max_factor_ratio2" / "lamb_lr0.01_seed1.json", None),
                   (folder / "report_max_factor_ratio2" / "kfac_defaults_seed1.json", {"max_factor_ratio": 2})]


def test_a_candidates_fit_reads_its_own_pairs_and_writes_beside_the_defaults_summary(tmp_path: Path) -> None:
    """The fit of a candidate's reruns, where only some batches have them: those batches, from their own folder, into
    ``summary_<candidate>.json``; the defaults' summary is left as it was. (A candidate no committed rerun has: the
    committed ones are amendment 9's ``max_factor_ratio2``.)"""
    from benchmarks.convergence.cli import main

    results = committed_records(tmp_path)
    before = (results / "summary.json").read_text()
    report = results / "b4096" / "report"
    shutil.copytree(report, results / "b4096" / "report_max_factor_ratio3")
    kfac = json.loads((report / "kfac_defaults_seed1.json").read_text())
    kfac["curve"]["seconds"] = [t / 2 for t in kfac["curve"]["seconds"]]  # cheaper steps: the fit read this folder
    (results / "b4096" / "report_max_factor_ratio3" / "kfac_defaults_seed1.json").write_text(json.dumps(kfac))
    summary = main(["scaling", "--stage", "fit", "--results", str(results), "--kfac-set", "max_factor_ratio=3"])
    assert list(summary["per_batch"]) == ["4096"] and summary["candidate"] == {"max_factor_ratio": 3}
    committed = json.loads(before)["per_batch"]["4096"]["kfac_to_lamb_final"]["time_ratio"]
    assert summary["per_batch"]["4096"]["kfac_to_lamb_final"]["time_ratio"]["mean"] < committed["mean"]
    assert json.loads((results / "summary_max_factor_ratio3.json").read_text())["candidate"] == {"max_factor_ratio": 3}
    assert (results / "scaling_max_factor_ratio3.png").is_file() and (results / "summary.json").read_text() == before


def test_a_candidates_plot_names_the_candidate_in_its_legend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A reader of scaling_<candidate>.png must not take its K-FAC for ``{"enabled": true}``."""
    import matplotlib.axes

    labels: list[str] = []
    original = matplotlib.axes.Axes.plot

    def plot(self: Any, *args: Any, **kwargs: Any) -> Any:
        labels.append(kwargs.get("label", ""))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    summary = json.loads((RECORDS / "summary.json").read_text())
    plot_scaling({**summary, "candidate": {"max_factor_ratio": 2}}, out=tmp_path / "c.png")
    assert any('"max_factor_ratio": 2' in label for label in labels)
    assert not any('{"enabled": true}, ' in label for label in labels)


def test_a_stage_that_tunes_lamb_refuses_a_candidates_keys() -> None:
    """LAMB's grid has no K-FAC run: a candidate named there would be silently dropped."""
    from benchmarks.convergence.cli import main

    for stage in ("plan", "tune", "edges"):
        with pytest.raises(SystemExit, match=f"--kfac-set: --stage {stage} does not read it"):
            main(["scaling", "--stage", stage, "--text", "absent.txt", "--kfac-set", "max_factor_ratio=2"])
