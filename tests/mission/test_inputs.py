"""mission: what the main job is given is what it trains on, or it says why not (issue 21, items 3, 4, 14)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kaisa_ds.config import KFACConfig
from mission import run as mission_run
from mission import stages

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("given", ["--squad-train", "--squad-eval"])
def test_one_squad_file_alone_is_refused_naming_the_other(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    """One SQuAD file alone once silently became the built-in questions for both."""
    with pytest.raises(SystemExit):
        mission_run.parse_args([given, "some.json"])
    other = "--squad-eval" if given == "--squad-train" else "--squad-train"
    assert other in capsys.readouterr().err


def _fake_stages(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    launched: list[list[str]] = []

    def fake_launch(module: str, args: list[str], *, ranks: int, log: Path) -> float:
        launched.append([module, *args])
        return 1.0

    monkeypatch.setattr(stages, "launch", fake_launch)
    return launched


def test_given_text_without_squad_files_says_loudly_that_the_questions_are_not_about_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    launched = _fake_stages(monkeypatch)
    text = tmp_path / "text.txt"
    text.write_text("Some text.\n\nMore text.\n")
    with caplog.at_level(logging.WARNING, logger="mission"):
        assert mission_run.main(["--output", str(tmp_path / "out"), "--data", str(text), "--articles", "30",
                                 "--phase2-steps", "60"]) == 0
    assert any(a[0] == "squad_finetune" for a in launched)
    assert "not in the pretraining text" in caplog.text
    report = (tmp_path / "out" / "report.md").read_text()
    assert "not in the pretraining text" in report
    warnings = json.loads((tmp_path / "out" / "report.json").read_text())["warnings"]
    assert any("not in the pretraining text" in w for w in warnings)


def test_a_phase_shorter_than_one_kfac_interval_is_warned_in_the_log_and_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _fake_stages(monkeypatch)
    with caplog.at_level(logging.WARNING):
        mission_run.main(["--output", str(tmp_path / "out"), "--articles", "30", "--phase1-steps", "8"])
    assert "inv_update_steps" in caplog.text and "8" in caplog.text
    warnings = json.loads((tmp_path / "out" / "report.json").read_text())["warnings"]
    assert any("inv_update_steps" in w and "phase 1" in w for w in warnings)


def test_the_main_jobs_phase_configs_fit_their_default_phase_lengths(caplog: pytest.LogCaptureFixture) -> None:
    """Phase 2's 30 steps once ran under inv_update_steps 50: one decomposition from step 0 for the whole phase."""
    from bert_pretrain.intervals import interval_warnings

    args = mission_run.parse_args([])
    for phase, steps in ((1, args.phase1_steps), (2, args.phase2_steps)):
        config = json.loads((REPO / mission_run.phase_config(args, phase=phase, suffix="_kfac")).read_text())
        assert interval_warnings(config, steps=steps, source=f"phase {phase}") == []
        section = {k: v for k, v in config["kfac"].items() if k != "enabled"}
        # the library's default where the section is silent ("auto": its longest, before the batch is known)
        inv = KFACConfig.from_dict(section).inv_update_steps_at(0, rows=None)
        assert steps // inv >= 2, (phase, inv)  # several decompositions per phase  # several decompositions per phase


def test_interval_warnings_name_the_key_and_the_fix() -> None:
    from bert_pretrain.intervals import interval_warnings

    config = {"kfac": {"enabled": True, "factor_update_steps": 5, "inv_update_steps": 50}}
    (warning,) = interval_warnings(config, steps=30, source="--config x.json")
    assert "kfac.inv_update_steps 50" in warning and "30 steps" in warning and "x.json" in warning
    assert interval_warnings({"kfac": {"enabled": False, "inv_update_steps": 50}}, steps=30, source="x") == []
    assert interval_warnings({"optimizer": {}}, steps=30, source="x") == []


def test_a_section_that_leaves_the_intervals_out_is_checked_at_the_librarys_defaults() -> None:
    """`"kfac": {"enabled": true}` once passed as every-step updates (the old default 1), so a phase shorter than
    the defaults' 50-step decomposition interval ran under one decomposition without a word."""
    from bert_pretrain.intervals import interval_warnings

    inv = KFACConfig().inv_update_steps_at(0, rows=None)  # "auto" before the batch is known: its longest
    (warning,) = interval_warnings({"kfac": {"enabled": True}}, steps=inv, source="x")
    assert f"kfac.inv_update_steps 'auto' (up to {inv} steps by the batch) (the library's default)" in warning
    assert interval_warnings({"kfac": {"enabled": True}}, steps=inv + 1, source="x") == []


def test_the_seed_reaches_every_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--seed once reached pretraining and the built-in data but not SQuAD fine-tuning (its own default 42)."""
    launched = _fake_stages(monkeypatch)
    mission_run.main(["--output", str(tmp_path / "out"), "--articles", "30", "--seed", "3"])
    assert len(launched) == 6
    for args in launched:
        assert args[args.index("--seed") + 1] == "3", args[0]


def test_articles_with_every_input_given_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--articles sizes the built-in corpus and questions: with --data and both SQuAD files nothing reads it."""
    with pytest.raises(SystemExit):
        mission_run.parse_args(["--data", "a.txt", "--squad-train", "t.json", "--squad-eval", "e.json",
                                "--articles", "50"])
    assert "--articles" in capsys.readouterr().err


def test_a_missing_phase_config_fails_before_any_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launched = _fake_stages(monkeypatch)
    with pytest.raises(SystemExit, match="--config-prefix"):
        mission_run.main(["--output", str(tmp_path / "out"), "--articles", "30", "--config-prefix", "ds_configs/no"])
    assert launched == []


def test_tiny_cpu_configs_on_a_larger_model_are_named_in_the_report(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--model-size mini once trained with the BERT-tiny CPU recipes (pretraining and SQuAD lr) without a word."""
    _fake_stages(monkeypatch)
    mission_run.main(["--output", str(tmp_path / "out"), "--articles", "30", "--model-size", "mini"])
    warnings = " ".join(json.loads((tmp_path / "out" / "report.json").read_text())["warnings"])
    assert "--squad-config" in warnings and "--config-prefix" in warnings and "mini" in warnings


def test_a_changed_config_file_reruns_its_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rerun skips finished stages; a config edited in place (same path, same arguments) once left its stage
    "already done" with the old settings."""
    launched: list[list[str]] = []

    def fake_launch(module: str, args: list[str], *, ranks: int, log: Path) -> float:
        out = Path(args[args.index("--output") + 1])
        out.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "eval_results.json"):
            (out / name).write_text("{}")
        launched.append([module, *args])
        return 1.0

    monkeypatch.setattr(stages, "launch", fake_launch)
    config = tmp_path / "kfac1.json"
    config.write_text((REPO / "ds_configs" / "bert_tiny_phase1_kfac.json").read_text())
    argv = ["--output", str(tmp_path / "out"), "--articles", "30", "--kfac-phase1-config", str(config)]
    mission_run.main(argv)
    mission_run.main(argv)
    assert len(launched) == 6  # the second run skipped every stage
    config.write_text(config.read_text().replace('"damping": 0.0001', '"damping": 0.001'))
    mission_run.main(argv)
    rerun = [a[a.index("--output") + 1] for a in launched[6:]]
    assert rerun == [str(tmp_path / "out" / "kfac" / p) for p in ("phase1", "phase2", "squad")]


@pytest.mark.parametrize("flag", ["--data", "--vocab", "--squad-config"])
def test_a_missing_input_file_is_refused_at_once_by_its_flag(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        mission_run.parse_args([flag, "no/such/file.txt"])
    assert f"{flag} no/such/file.txt: no such file" in capsys.readouterr().err


def test_an_evaluation_interval_as_long_as_phase_1_is_warned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--phase1-steps 10 with --eval-every 50: the held-out curves (and the crossing of LAMB's final loss) had one
    point, the last, without a word. Left out, the interval follows the phase's length."""
    _fake_stages(monkeypatch)
    mission_run.main(["--output", str(tmp_path / "out"), "--articles", "30", "--phase1-steps", "10",
                      "--eval-every", "50"])
    warnings = " ".join(json.loads((tmp_path / "out" / "report.json").read_text())["warnings"])
    assert "--eval-every 50" in warnings and "--phase1-steps 10" in warnings
    assert mission_run.parse_args(["--phase1-steps", "10"]).eval_every * 2 <= 10


def test_every_config_prefix_the_docs_name_has_both_phases_of_both_variants() -> None:
    """The README told users `--config-prefix ds_configs/bert_large`, a prefix with no configs behind it."""
    import re

    docs = [REPO / "README.md", REPO / "ds_configs" / "README.md", REPO / "mission" / "run.py"]
    prefixes = {m for doc in docs for m in re.findall(r"--config-prefix[ =]`?(ds_configs/[\w./-]+?)`?[\s,)]",
                                                       doc.read_text())}
    assert prefixes, "the docs name no --config-prefix example"
    for prefix in sorted(prefixes):
        args = mission_run.parse_args(["--config-prefix", prefix])
        for phase in (1, 2):
            for suffix in mission_run.VARIANTS.values():
                config = mission_run.phase_config(args, phase=phase, suffix=suffix)
                assert (REPO / config).is_file(), f"--config-prefix {prefix}: {config} does not exist"


def test_kfacs_phase_1_ends_at_lambs_final_held_out_loss_unless_told_to_run_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """K-FAC's phase 1 is given LAMB's final phase-1 held-out loss as --stop-at-heldout (LAMB's phase 1 runs
    first); LAMB's is not; --kfac-full-run gives none; a LAMB rerun with another final reruns K-FAC's phase 1."""
    launched = _fake_stages(monkeypatch)
    out = tmp_path / "out"
    lamb_summary = out / "lamb" / "phase1" / "summary.json"

    def launch_and_finish(module: str, args: list[str], *, ranks: int, log: Path) -> float:
        launched.append([module, *args])
        output = Path(args[args.index("--output") + 1])
        output.mkdir(parents=True, exist_ok=True)
        (output / ("summary.json" if module == "bert_pretrain" else "eval_results.json")).write_text(
            json.dumps({"heldout_mlm_loss": 4.321}))
        return 1.0

    monkeypatch.setattr(stages, "launch", launch_and_finish)
    mission_run.main(["--output", str(out), "--articles", "30"])
    phase1 = {a[a.index("--output") + 1]: a for a in launched
              if a[0] == "bert_pretrain" and a[a.index("--phase") + 1] == "1"}
    assert "--stop-at-heldout" not in phase1[str(out / "lamb" / "phase1")]
    kfac = phase1[str(out / "kfac" / "phase1")]
    assert float(kfac[kfac.index("--stop-at-heldout") + 1]) == 4.321
    assert kfac[kfac.index("--max-seq-length") + 1] == "64"  # the small regime's sequences, not phase 1's 128
    assert json.loads(lamb_summary.read_text())["heldout_mlm_loss"] == 4.321
    launched.clear()
    mission_run.main(["--output", str(out), "--articles", "30", "--kfac-full-run"])
    kfac_runs = [a for a in launched if a[0] == "bert_pretrain" and str(out / "kfac" / "phase1") in a]
    assert kfac_runs and "--stop-at-heldout" not in kfac_runs[0]  # a changed argument: rerun, without the stop


def test_the_main_jobs_phase_1_is_the_scaling_studys_batch_at_lambs_tuned_rate_and_kfacs_defaults() -> None:
    """The rule (benchmarks/results/mission/rule_batch.md): phase 1 at 8,192 tokens a step, the smallest of the
    scaling study's batches at or above LAMB's fitted critical batch, at today's token budget, LAMB at the rate
    the study's tuning chose there, K-FAC with nothing but ``enabled``: the shipped configs must not drift."""
    from benchmarks.convergence.regimes import ds_config
    from benchmarks.convergence.scaling import RULE

    summary = json.loads((REPO / "benchmarks/results/convergence/scaling/summary.json").read_text())
    late = f"{summary['targets'][-1]:.4f}"
    critical = summary["fits"]["lamb"][late]["b_crit_tokens"]
    assert min(b for b in RULE.batches if b >= critical) == 8192
    args = mission_run.parse_args([])
    steps = 1500 * 2048 // 8192
    regime = RULE.regime_for(8192, steps=steps)
    chosen = json.loads((REPO / "benchmarks/results/convergence/scaling/b8192/chosen.json").read_text())["lamb"]
    expected = ds_config(regime, lr=chosen["lr"], warmup=RULE.warmup, steps=steps, kfac=None)
    expected.pop("gradient_accumulation_steps")  # left to DeepSpeed: the shipped file must load on any world size
    lamb = json.loads((REPO / mission_run.phase_config(args, phase=1, suffix="")).read_text())
    kfac = json.loads((REPO / mission_run.phase_config(args, phase=1, suffix="_kfac")).read_text())
    assert lamb == expected
    assert kfac == lamb | {"kfac": {"enabled": True}}  # nothing of K-FAC set: the library's defaults
    assert (args.phase1_steps, args.phase1_seq_length, args.phase1_max_predictions, args.eval_every) == \
        (steps, RULE.seq, RULE.max_predictions, regime.eval_every)
    assert args.ranks == 2


def test_every_tuned_rate_of_the_batch_recipe_is_the_scaling_studys_choice() -> None:
    from mission.batch import TUNED_LR

    folders = sorted((REPO / "benchmarks/results/convergence/scaling").glob("b*/chosen.json"))
    chosen = {int(f.parent.name[1:]): json.loads(f.read_text())["lamb"]["lr"] for f in folders}
    assert chosen == TUNED_LR


def test_another_phase1_batch_reshapes_both_variants_at_the_same_token_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launched = _fake_stages(monkeypatch)
    out = tmp_path / "out"
    mission_run.main(["--output", str(out), "--articles", "30", "--phase1-batch", "16384"])
    phase1 = [a for a in launched if a[0] == "bert_pretrain" and a[a.index("--phase") + 1] == "1"]
    assert len(phase1) == 2
    for run in phase1:
        assert run[run.index("--max-steps") + 1] == str(round(1500 * 2048 / 16384))
        config = json.loads(Path(run[run.index("--config") + 1]).read_text())
        assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"]) == (256, 64)
        assert "gradient_accumulation_steps" not in config  # DeepSpeed infers 2: 128 a rank, two passes of 64
        assert config["optimizer"]["params"]["lr"] == 0.028284  # the study's choice at 16,384
        assert config["lr_schedule"]["total_steps"] == 188
    kfac = json.loads((out / "configs" / "phase1_kfac.json").read_text())
    assert kfac["kfac"] == {"enabled": True}
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["phase1_batch_tokens"] == 16384
    assert not any("did not tune" in w for w in report["warnings"])  # the study tuned LAMB at 16,384


def test_an_untuned_phase1_batch_is_warned_and_a_ragged_one_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_stages(monkeypatch)
    mission_run.main(["--output", str(tmp_path / "out"), "--articles", "30", "--phase1-batch", "12288"])
    warnings = json.loads((tmp_path / "out" / "report.json").read_text())["warnings"]
    assert any("--phase1-batch 12288" in w and "did not tune" in w for w in warnings), warnings
    with pytest.raises(SystemExit):
        mission_run.parse_args(["--phase1-batch", "1000"])
    assert "--phase1-batch 1000" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mission_run.parse_args(["--phase1-batch", "4096", "--config-prefix", "ds_configs/bert_tiny"])
    assert "--config-prefix" in capsys.readouterr().err


@pytest.mark.skipif(not (REPO.parent / "shared" / "data" / "wikitext-2" / "valid.txt").is_file(),
                    reason="../shared/data absent")
def test_the_built_in_corpus_is_the_size_of_the_small_regimes_training_text(tmp_path: Path) -> None:
    """The rule (benchmarks/results/mission/rule.md): the main job's corpus has as many words as the small
    regime's training part, so phase 1 passes over its text about as often; within 5%."""
    from benchmarks.convergence.parts import write_parts
    from benchmarks.convergence.regimes import REGIMES
    from bert_pretrain.corpus import generate_corpus

    parts = write_parts([REPO.parent / "shared" / "data" / t for t in REGIMES["small"].texts], tmp_path)
    train_words = len(parts.path("train").read_text().split())
    corpus = tmp_path / "corpus.txt"
    generate_corpus(seed=0, num_articles=mission_run.ARTICLES).write_text(corpus)
    words = len(corpus.read_text().split())
    assert abs(words - train_words) <= 0.05 * train_words, (words, train_words)


def test_no_shipped_config_is_a_byte_copy_of_another_and_the_main_jobs_phase_2_is_the_standard_one() -> None:
    """The main job's phase-2 configs were copies of bert_tiny_phase2*.json that could drift apart unseen: one
    recipe, one file. Its phase 2 reads the standard BERT-tiny phase-2 configs; phase 1 its own."""
    import hashlib

    digests: dict[str, str] = {}
    for path in sorted((REPO / "ds_configs").glob("*.json")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest not in digests, f"{path.name} is a byte copy of {digests[digest]}"
        digests[digest] = path.name
    args = mission_run.parse_args([])
    for suffix in ("", "_kfac"):
        assert mission_run.phase_config(args, phase=2, suffix=suffix) == f"ds_configs/bert_tiny_phase2{suffix}.json"
        assert mission_run.phase_config(args, phase=1, suffix=suffix) == \
            f"ds_configs/bert_tiny_mission_phase1{suffix}.json"
    given = mission_run.parse_args(["--config-prefix", "ds_configs/bert_large_bf16"])
    assert [mission_run.phase_config(given, phase=p, suffix="_kfac") for p in (1, 2)] == \
        ["ds_configs/bert_large_bf16_phase1_kfac.json", "ds_configs/bert_large_bf16_phase2_kfac.json"]


def test_a_given_phase1_config_without_total_steps_asks_for_phase1_steps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With configs of one's own, phase 1's length is the config's lr_schedule.total_steps; a config without it is
    refused naming the file and the flag to give, not run at some other length."""
    config = json.loads((REPO / "ds_configs" / "bert_tiny_mission_phase1.json").read_text())
    del config["lr_schedule"]["total_steps"]
    lamb = tmp_path / "lamb.json"
    lamb.write_text(json.dumps(config))
    kfac = REPO / "ds_configs" / "bert_tiny_mission_phase1_kfac.json"
    with pytest.raises(SystemExit):
        mission_run.parse_args(["--lamb-phase1-config", str(lamb), "--kfac-phase1-config", str(kfac)])
    err = capsys.readouterr().err
    assert "lamb.json" in err and "lr_schedule.total_steps" in err and "--phase1-steps" in err
    args = mission_run.parse_args(["--lamb-phase1-config", str(lamb), "--kfac-phase1-config", str(kfac),
                                   "--phase1-steps", "40"])
    assert (args.phase1_steps, args.eval_every) == (40, 5)
