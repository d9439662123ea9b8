"""convergence: disjoint data parts, equal tuning budgets, the figures' arithmetic, and the --quick protocol end to
end through bert_pretrain (tuning reads only the tune part, reported figures only the report part)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.convergence import analysis
from benchmarks.convergence.cli import DATA, DEFAULT_VOCAB, main
from benchmarks.convergence.parts import PARTS, SplitError, units, write_parts
from benchmarks.convergence.regimes import LIBRARY_DEFAULTS, REGIMES
from benchmarks.convergence.scale import check_scale, scale_of
from bert_pretrain.data.documents import iter_documents
from bert_pretrain.data.sources import resolve
from kaisa_ds.report.metrics_log import read_rows

DEFAULT_TEXT = DATA / "wikitext-2" / "valid.txt"
SQUAD = DATA / "squad" / "dev-v1.1-articles-00-39.json"
REAL_DATA = pytest.mark.skipif(not (DEFAULT_TEXT.is_file() and DEFAULT_VOCAB.is_file() and SQUAD.is_file()),
                               reason=f"real data absent: {DEFAULT_TEXT}, {SQUAD} and {DEFAULT_VOCAB}")


def _check_disjoint_cover(parts: Any, n: int) -> None:
    sets = [set(parts.units[p]) for p in PARTS]
    assert sum(len(s) for s in sets) == n and set().union(*sets) == set(range(n))
    assert all(len(s) >= 3 for s in sets)


@REAL_DATA
def test_wikitext_splits_by_article_into_three_disjoint_parts(tmp_path: Path) -> None:
    parts = write_parts(DEFAULT_TEXT, tmp_path / "a")
    chunks = units(DEFAULT_TEXT.read_text(encoding="utf-8"))
    _check_disjoint_cover(parts, len(chunks))
    titles = {p: {ln for ln in parts.path(p).read_text().splitlines() if ln.count("=") == 2 and "<unk>" not in ln}
              for p in PARTS}  # titles with <unk> repeat across articles
    assert all(titles[p] for p in PARTS)  # every part holds whole articles, titles included
    assert not (titles["train"] & titles["tune"] or titles["train"] & titles["report"] or
                titles["tune"] & titles["report"])
    again = write_parts(DEFAULT_TEXT, tmp_path / "b")
    assert again.units == parts.units and all(
        parts.path(p).read_bytes() == again.path(p).read_bytes() for p in PARTS)  # deterministic


def test_plain_text_splits_by_block_and_refuses_too_little(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("\n\n".join(f"Block {i} has a sentence. And another one." for i in range(20)) + "\n")
    parts = write_parts(text, tmp_path / "parts", seed=3)
    _check_disjoint_cover(parts, 20)
    blocks = {p: set(parts.path(p).read_text().strip().split("\n\n")) for p in PARTS}
    assert sum(len(b) for b in blocks.values()) == 20 and len(set().union(*blocks.values())) == 20
    text.write_text("one\n\ntwo\n\nthree\n")
    with pytest.raises(SplitError, match="at least 9"):
        write_parts(text, tmp_path / "few")


def _documents(parts: Any) -> list[list[str]]:
    return list(iter_documents(resolve([parts.path(p) for p in PARTS])))


@REAL_DATA
def test_wikitext_and_squad_pool_their_articles_and_each_squad_article_is_one_document(tmp_path: Path) -> None:
    alone = write_parts(DEFAULT_TEXT, tmp_path / "wiki")
    pooled = write_parts([DEFAULT_TEXT, SQUAD], tmp_path / "pooled")
    squad = json.loads(SQUAD.read_text())["data"]
    _check_disjoint_cover(pooled, len(units(DEFAULT_TEXT.read_text())) + len(squad))
    wiki_docs, pooled_docs = _documents(alone), _documents(pooled)
    assert len(pooled_docs) == len(wiki_docs) + len(squad)  # a SQuAD article's paragraphs stay one document
    read = " ".join(sentence for doc in pooled_docs for sentence in doc)
    assert all(" ".join(p["context"].split())[:60] in read for article in squad for p in article["paragraphs"])
    assert sum(len(" ".join(d).split()) for d in pooled_docs) > 1.8 * sum(len(" ".join(d).split()) for d in wiki_docs)
    assert all((DATA / t).is_file() for r in REGIMES.values() for t in r.texts)  # the regimes' defaults exist


def test_headless_blocks_pooled_with_wikitext_stay_one_document_each(tmp_path: Path) -> None:
    wiki = tmp_path / "w.txt"
    wiki.write_text("".join(f" = Article {i} = \n\n Text of article {i} . Its second sentence .\n\n" for i in range(6)))
    plain = tmp_path / "p.txt"
    plain.write_text("\n\n".join(f"Block {i} has a sentence. And another one." for i in range(6)) + "\n")
    parts = write_parts([wiki, plain], tmp_path / "parts")
    docs = _documents(parts)
    assert len(docs) == 12  # 6 articles + 6 blocks: no block merged into the section before it
    assert sorted(d[0] for d in docs if d[0].startswith("Block")) == [f"Block {i} has a sentence." for i in range(6)]


def test_a_json_text_that_is_not_squad_and_a_missing_text_are_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text('{"rows": []}')
    with pytest.raises(SplitError, match=r"notes\.json.*SQuAD"):
        write_parts(bad, tmp_path / "parts")
    with pytest.raises(SystemExit, match=r"gone\.txt does not exist"):
        main(["tune", "--regime", "small", "--text", str(tmp_path / "gone.txt"), *_common(tmp_path)])


def test_regimes_have_equal_tuning_budgets_and_the_asked_batches() -> None:
    for regime in REGIMES.values():
        regime.check_budget()
        assert len(regime.lamb_lrs) >= 3 and len(regime.warmups) >= 2
        assert min(len(regime.dampings), len(regime.kfac_lr_scales), len(regime.intervals)) >= 2
    assert REGIMES["small"].global_batch == 32 and REGIMES["large"].global_batch >= 256
    assert REGIMES["large"].gas > 1  # the large batch comes from gradient accumulation


def _record(opt: str, seed: int, part: str, values: list[float], *, seconds_per_step: float = 1.0) -> dict[str, Any]:
    steps = [10.0 * (i + 1) for i in range(len(values))]
    return {"spec": {"optimizer": opt, "seed": seed, "eval_part": part, "steps": int(steps[-1])},
            "curve": {"steps": steps, "seconds": [s * seconds_per_step for s in steps], "values": values},
            "final": values[-1], "train_seconds": steps[-1] * seconds_per_step}


def test_compare_pairs_seeds_interpolates_and_reports_never_reached() -> None:
    lamb = [_record("lamb", 1, "report", [7.0, 6.0, 5.0, 4.0]), _record("lamb", 2, "report", [7.0, 6.5, 6.0, 5.0])]
    kfac = [_record("kfac", 1, "report", [6.0, 5.0, 4.5, 3.0], seconds_per_step=1.5),
            _record("kfac", 2, "report", [7.0, 6.8, 6.6, 6.4], seconds_per_step=1.5)]
    out = analysis.compare(lamb, kfac, plateau_loss=6.0, targets=[5.5, 5.0])
    seed1, seed2 = out["pairs"]
    assert seed1["kfac_steps_to_lamb_final"] == pytest.approx(100 / 3)  # 4.5 → 3.0 crosses 4.0 a third of the way
    assert seed1["kfac_seconds_to_lamb_final"] == pytest.approx(50.0) and seed1["time_ratio"] == pytest.approx(1.25)
    assert seed2["kfac_steps_to_lamb_final"] is None and seed2["time_ratio"] is None
    assert out["kfac_to_lamb_final"]["time_ratio"]["missing"] == 1 and out["target_met"] is False
    lamb_runs = {r["seed"]: r for r in out["runs"]["lamb"]}
    assert lamb_runs[1]["plateau_exit_step"] == pytest.approx(25.0)  # 5.5 = plateau − 0.5, halfway from 20 to 30
    assert lamb_runs[2]["plateau_exit_step"] == pytest.approx(35.0)
    assert out["lamb_leaves_plateau_well_before_end"] is False  # 35 > 2/3 of 40
    assert out["per_optimizer"]["kfac"]["final"]["mean"] == pytest.approx(4.7)


def test_choice_reads_the_tune_part_and_figures_the_report_part() -> None:
    tune = [_record("lamb", 0, "tune", [7.0, 6.0]), _record("lamb", 0, "tune", [7.0, 5.5])]
    assert analysis.choose(tune) is tune[1]
    diverged = {**_record("lamb", 0, "tune", [7.0]), "final": None, "error": "non-finite loss"}
    assert analysis.choose([diverged, *tune]) is tune[1]  # a failed run has no final loss and is never chosen
    with pytest.raises(ValueError, match="no finished"):
        analysis.choose([diverged])
    with pytest.raises(ValueError, match="tune part only"):
        analysis.choose([*tune, _record("lamb", 0, "report", [5.0])])
    with pytest.raises(ValueError, match="report part"):
        analysis.compare(tune, tune, plateau_loss=6.0, targets=[5.5])


def test_a_failed_final_lamb_run_gives_no_target_for_its_seed() -> None:
    lamb = [{**_record("lamb", 1, "report", [7.0]), "final": None, "error": "killed"}]
    out = analysis.compare(lamb, [_record("kfac", 1, "report", [6.0, 5.0])], plateau_loss=6.0, targets=[5.5])
    assert out["pairs"][0]["kfac_steps_to_lamb_final"] is None and out["target_met"] is False
    assert out["lamb_leaves_plateau_well_before_end"] is False


def test_unigram_entropy() -> None:
    assert analysis.unigram_entropy([1, 1, 1]) == 0.0
    assert analysis.unigram_entropy([1, 2, 3, 4]) == pytest.approx(1.3862943611198906)


def _common(tmp_path: Path) -> list[str]:
    return ["--quick", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")]


@REAL_DATA
@pytest.mark.slow  # ~55 s; default suite: the harness learns real text in test_convergence_minimal.py
def test_quick_tuning_trains_on_train_and_chooses_on_tune(tmp_path: Path) -> None:
    """tune --quick (small regime): a 1-run LAMB grid and a 1-run K-FAC grid, 2 bert_pretrain launches."""
    chosen = main(["tune", "--regime", "small", *_common(tmp_path)])
    tune_records = sorted((tmp_path / "results" / "small" / "tune").glob("*.json"))
    assert [r.name.split("_")[0] for r in tune_records] == ["kfac", "lamb"]
    parts = Path(chosen["parts"]).parent
    assert parts.parent == tmp_path / "work" / "parts"
    for path in tune_records:
        record = json.loads(path.read_text())
        command = record["command"]
        assert command[command.index("--eval-data") + 1] == f"tune={parts / 'tune.txt'}"
        assert command[command.index("--data") + 1] == str(parts / "train.txt")
        assert "report" not in " ".join(command)
        assert record["spec"]["eval_part"] == "tune" and record["curve"]["values"]
    assert chosen["lamb"]["lr"] == REGIMES["small"].lamb_lrs[0]
    assert chosen["kfac"]["damping"] == REGIMES["small"].dampings[0]
    assert {r["optimizer"] for r in chosen["runs"]} == {"lamb", "kfac"}
    assert chosen["budget"]["lamb"] == chosen["budget"]["kfac"]
    kfac_config = json.loads((tmp_path / "results" / "small" / "chosen_kfac_ds_config.json").read_text())
    assert kfac_config["kfac"]["damping"] == chosen["kfac"]["damping"] and "lr" not in kfac_config["kfac"]


@REAL_DATA
@pytest.mark.slow  # ~80 s; default suite: the harness learns real text in test_convergence_minimal.py
def test_quick_final_reports_figures_from_the_report_part(tmp_path: Path) -> None:
    """final --quick (small regime, seed 1) from a recorded choice (tuned --quick: 4 steps per run): 2 bert_pretrain
    launches."""
    chosen: dict[str, Any] = {"lamb": {"lr": 0.01, "warmup": 0.1}, "budget": {"lamb": {"steps_per_run": 4}},
                              "kfac": {"lr": 0.015, "warmup": 0.1, "damping": 0.01, "factor_every": 1,
                                       "inv_every": 2}}
    (tmp_path / "results" / "small").mkdir(parents=True)
    (tmp_path / "results" / "small" / "chosen.json").write_text(json.dumps(chosen))
    result = main(["final", "--regimes", "small", *_common(tmp_path)])
    small = result["regimes"]["small"]
    parts = Path(small["parts"]).parent
    assert parts.parent == tmp_path / "work" / "parts"
    for opt in ("lamb", "kfac"):
        record = json.loads((tmp_path / "results" / "small" / "final" / f"{opt}_seed1.json").read_text())
        command = record["command"]
        assert command[command.index("--eval-data") + 1] == f"report={parts / 'report.txt'}"
        assert record["spec"]["lr"] == chosen[opt]["lr"] and record["spec"]["seed"] == 1
        rows = read_rows(tmp_path / "work" / "small" / "report" / f"{opt}_seed1" / "run" / "metrics.jsonl")
        reported = [r["heldout_report_mlm_loss"] for r in rows if "heldout_report_mlm_loss" in r]
        assert record["curve"]["values"] == reported and len(reported) == 2  # steps 2 and 4
        # the training loss beside it: the mean of each window's logged training MLM loss, at the same steps
        windows = [[r["mlm_loss"] for r in rows if lo < r["step"] <= hi] for lo, hi in ((0, 2), (2, 4))]
        assert record["train_curve"]["steps"] == record["curve"]["steps"]
        assert record["train_curve"]["values"] == pytest.approx([sum(w) / len(w) for w in windows])
        assert not any("heldout_tune_mlm_loss" in r or "heldout_mlm_loss" in r for r in rows)
        assert all(r["elapsed_s"] > 0 for r in rows)
        assert small["per_optimizer"][opt]["final"]["mean"] == pytest.approx(reported[-1])
    assert small["plateau"] > 0 and small["report_target_entropy"] > 0
    assert (tmp_path / "results" / "small" / "final.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "results" / "final.json").read_text())["regimes"]["small"]["pairs"]
    # the ablation reuses both final records (no new launch for them) and runs K-FAC with identity curvature only
    finals = {p: p.stat().st_mtime_ns for p in (tmp_path / "results" / "small" / "final").glob("*.json")}
    abl = main(["ablation", "--regime", "small", "--damping", "3", *_common(tmp_path)])
    assert {p: p.stat().st_mtime_ns for p in finals} == finals
    identity = json.loads((tmp_path / "results" / "small" / "ablation" / "identity_damping3_seed1.json").read_text())
    kfac = json.loads((tmp_path / "results" / "small" / "final" / "kfac_seed1.json").read_text())
    assert identity["inputs"]["ds_config"]["kfac"] == {**kfac["inputs"]["ds_config"]["kfac"], "damping": 3.0}
    assert identity["spec"]["lr"] == kfac["spec"]["lr"] and identity["curve"]["values"]
    assert {r["variant"] for r in abl["rows"]} == {"kfac", "identity"}
    assert json.loads((tmp_path / "results" / "small" / "ablation.json").read_text())["identity_damping"] == 3.0
    # the size/direction split: the raw gradient at K-FAC's size, a record and a summary of its own
    main(["ablation", "--regime", "small", "--variant", "kfac-size", *_common(tmp_path)])
    sized = json.loads((tmp_path / "results" / "small" / "ablation" / "kfac-size_seed1.json").read_text())
    assert sized["inputs"]["ds_config"]["kfac"] == {**kfac["inputs"]["ds_config"]["kfac"], "grafting": "kfac-size"}
    assert json.loads((tmp_path / "results" / "small" / "ablation_kfac-size.json").read_text())["variant"] == \
        "kfac-size"
    # defaults: a kfac section of {"enabled": true} alone, at LAMB's lr and warmup; the finals are reused
    dflt = main(["defaults", "--regime", "small", *_common(tmp_path)])
    assert {p: p.stat().st_mtime_ns for p in finals} == finals
    record = json.loads((tmp_path / "results" / "small" / "defaults" / "defaults_seed1.json").read_text())
    assert record["inputs"]["ds_config"]["kfac"] == {"enabled": True}
    assert record["inputs"]["ds_config"]["optimizer"]["params"]["lr"] == chosen["lamb"]["lr"] != chosen["kfac"]["lr"]
    assert record["curve"]["values"] and {r["variant"] for r in dflt["rows"]} == {"tuned", "defaults"}
    assert set(json.loads((tmp_path / "results" / "small" / "defaults.json").read_text())["summary"]) == {
        "tuned", "defaults"}
    assert (tmp_path / "results" / "small" / "defaults.png").stat().st_size > 10_000
    # a candidate default is tried on the tune part only, beside LAMB's tuning run, never on the report part
    with pytest.raises(SystemExit, match="--part tune"):
        main(["defaults", "--regime", "small", "--set", "factor_update_steps=2", *_common(tmp_path)])
    cand = main(["defaults", "--regime", "small", "--part", "tune", "--set", "factor_update_steps=2",
                 *_common(tmp_path)])
    record = json.loads((tmp_path / "results" / "small" / "defaults_tune" /
                         "defaults_factor_update_steps2_seed0.json").read_text())
    assert record["inputs"]["ds_config"]["kfac"] == {"enabled": True, "factor_update_steps": 2}
    assert record["spec"]["eval_part"] == "tune" and record["spec"]["seed"] == 0
    command = record["command"]
    assert command[command.index("--eval-data") + 1].startswith("tune=")
    assert (tmp_path / "results" / "small" / "tune" / "lamb_lr0.01_warmup0.1.json").is_file()
    assert [r["variant"] for r in cand["rows"]] == ["defaults"]
    assert {p: p.stat().st_mtime_ns for p in finals} == finals


@REAL_DATA
@pytest.mark.slow  # ~50 s; the reuse key itself: test_a_recorded_run_is_reused_only_when_every_input_is_the_same
def test_tuning_reuses_records_when_only_the_other_grid_changed_and_reruns_stale_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A LAMB tuning record stays valid when the K-FAC grid changes (it once was relaunched, failed on its existing
    output folder and overwrote the good record with a failure); a run whose record is gone starts over."""
    import dataclasses

    from benchmarks.convergence import cli

    main(["tune", "--regime", "small", *_common(tmp_path)])
    lamb_record = next((tmp_path / "results" / "small" / "tune").glob("lamb_*.json"))
    before = lamb_record.read_text()
    changed = dataclasses.replace(REGIMES["small"], dampings=(REGIMES["small"].dampings[0] * 3,))
    monkeypatch.setitem(cli.REGIMES, "small", changed)
    main(["tune", "--regime", "small", *_common(tmp_path)])
    assert lamb_record.read_text() == before  # reused, not relaunched
    lamb_record.unlink()  # the run folder stays: the relaunch must start it over, not fail on it
    main(["tune", "--regime", "small", *_common(tmp_path)])
    record = json.loads(lamb_record.read_text())
    assert record["error"] is None and record["curve"]["values"]


def _fake_launches(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """bert_pretrain replaced by a stand-in that writes one held-out evaluation: the records' keys, not training."""
    from mission import jobs

    calls: list[list[str]] = []

    def fake_launch(module: str, args: list[str], *, ranks: int, log: Path) -> float:
        out = Path(args[args.index("--output") + 1])
        out.mkdir(parents=True, exist_ok=True)
        part = args[args.index("--eval-data") + 1].split("=")[0]
        (out / "metrics.jsonl").write_text(json.dumps({"step": 2, "loss": 5.0, "elapsed_s": 1.0,
                                                       f"heldout_{part}_mlm_loss": 5.0}) + "\n")
        calls.append(args)
        return 1.0

    monkeypatch.setattr(jobs, "launch", fake_launch)
    return calls


def _blocks(path: Path, n: int = 12) -> Path:
    path.write_text("\n\n".join(f"Block {i} says something about item {i}." for i in range(n)) + "\n")
    return path


def _fake_quick_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[str]], list[str]]:
    """Fake launches and evaluation caches, a 14-block text and a tiny vocabulary: the launches list and the
    flags every command of such a study takes."""
    calls = _fake_launches(monkeypatch)
    monkeypatch.setattr(analysis, "plateau", lambda cache, part: 6.0)
    monkeypatch.setattr(analysis, "frequency_model_loss", lambda cache, part, examples: 6.5)
    text, vocab = _blocks(tmp_path / "text.txt", n=14), tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nblock\n")
    return calls, ["--quick", "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r"), "--text", str(text),
                   "--vocab", str(vocab)]


@REAL_DATA
def test_quick_runs_write_outside_the_shipped_results_and_final_refuses_toy_choices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tune --quick` once overwrote the shipped small/chosen*.json (which the README tells main-job users to pass),
    and `final` then ran the toy-scale choice at full scale unchecked."""
    from benchmarks.convergence import cli

    _fake_launches(monkeypatch)
    monkeypatch.setattr(analysis, "plateau", lambda cache, part: 6.0)
    monkeypatch.setattr(analysis, "frequency_model_loss", lambda cache, part, examples: 6.5)
    monkeypatch.setattr(cli, "REPO", tmp_path)  # the defaults of --results and --work live under REPO
    shipped = tmp_path / "benchmarks" / "results" / "convergence"
    main(["tune", "--regime", "small", "--quick"])
    assert not (shipped / "small").exists()
    quick_chosen = next(tmp_path.rglob("chosen.json"))
    assert json.loads(quick_chosen.read_text())["tuned_at"]["scale"] == "quick"
    with pytest.raises(SystemExit, match="--quick"):  # a quick choice read by a full-scale final
        main(["final", "--regimes", "small", "--results", str(quick_chosen.parents[1]), "--work",
              str(tmp_path / "w")])
    with pytest.raises(SystemExit, match="--results"):  # quick records into the shipped folder
        main(["tune", "--regime", "small", "--quick", "--results", str(shipped)])


def test_final_refuses_a_recorded_choice_tuned_at_another_scale(tmp_path: Path) -> None:
    """A chosen.json written before the scale was recorded: its budget's steps per run say the scale."""

    chosen = {"regime": "small", "lamb": {"lr": 0.01, "warmup": 0.1}, "budget": {"lamb": {"steps_per_run": 4}},
              "kfac": {"lr": 0.01, "warmup": 0.1, "damping": 0.01, "factor_every": 1, "inv_every": 2}}
    with pytest.raises(SystemExit, match="4 steps"):
        check_scale(chosen, REGIMES["small"], path=tmp_path / "chosen.json")
    check_scale({**chosen, "budget": {"lamb": {"steps_per_run": 1500}}}, REGIMES["small"],
                    path=tmp_path / "chosen.json")
    # tuned at full scale on one text, final on another: the report part would not be the tuned text's
    parts = write_parts(_blocks(tmp_path / "a.txt"), tmp_path / "parts")
    tuned = {**chosen, "tuned_at": scale_of(REGIMES["small"], quick_scale=False, parts=parts)}
    check_scale(tuned, REGIMES["small"], path=tmp_path / "chosen.json", parts=parts)
    other = write_parts(_blocks(tmp_path / "b.txt", n=13), tmp_path / "parts")
    with pytest.raises(SystemExit, match="sources_sha256"):
        check_scale(tuned, REGIMES["small"], path=tmp_path / "chosen.json", parts=other)


def test_a_recorded_run_is_reused_only_when_every_input_is_the_same(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The reuse key once left out the vocabulary (and the split of the text): a changed run was "reused"."""
    from benchmarks.convergence.regimes import quick
    from benchmarks.convergence.runner import RunSpec, run

    calls = _fake_launches(monkeypatch)
    regime = quick(REGIMES["small"])
    text, vocab = _blocks(tmp_path / "text.txt"), tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nblock\n")
    spec = RunSpec(name="lamb", regime="small", optimizer="lamb", lr=0.01, warmup=0.1, steps=4, seed=0,
                   eval_part="tune")
    record = tmp_path / "results" / "lamb.json"

    def once(parts_max: int | None = None) -> None:
        parts = write_parts(text, tmp_path / "parts", max_units=parts_max)
        run(spec, regime, parts, vocab=vocab, work=tmp_path / "work", record=record, machine={})

    once()
    once()
    assert len(calls) == 1  # nothing changed: reused
    vocab.write_text(vocab.read_text() + "item\n")  # same path, other vocabulary
    once()
    assert len(calls) == 2
    once(parts_max=9)  # same source, another split of it
    assert len(calls) == 3
    once(parts_max=9)
    assert len(calls) == 3
    assert json.loads(record.read_text())["inputs"]["vocab_sha256"]


@pytest.mark.slow  # one more real launch; the quick tuning test above runs the harness end to end
@REAL_DATA
def test_a_run_evaluated_on_its_training_part_records_that_curve_under_its_own_key(tmp_path: Path) -> None:
    """--eval-train (same_day): bert_pretrain evaluates the training part beside the tune part, dropout off; the
    record holds that curve, and its key differs from the plain run's (neither is reused for the other). One real
    4-step launch."""
    from benchmarks.convergence.regimes import QUICK_UNITS, quick
    from benchmarks.convergence.runner import RunSpec, recorded_inputs, run, run_inputs

    regime = quick(REGIMES["small"])
    parts = write_parts([DATA / t for t in regime.texts], tmp_path / "parts", max_units=QUICK_UNITS)
    spec = RunSpec(name="lamb", regime="small", optimizer="lamb", lr=0.01, warmup=0.1, steps=4, seed=0,
                   eval_part="tune")
    record = run(spec, regime, parts, vocab=DEFAULT_VOCAB, work=tmp_path / "work", record=tmp_path / "lamb.json",
                 machine={}, also_on_train=True)
    rows = read_rows(tmp_path / "work" / "small" / "tune" / "lamb" / "run" / "metrics.jsonl")
    on_train = [r["heldout_train_mlm_loss"] for r in rows if "heldout_train_mlm_loss" in r]
    assert record["train_eval_curve"]["values"] == on_train and len(on_train) == 2  # steps 2 and 4
    assert record["curve"]["steps"] == record["train_eval_curve"]["steps"]
    assert on_train != record["curve"]["values"]  # another text than the tune part
    assert recorded_inputs(record) != run_inputs(spec, regime, parts, vocab=DEFAULT_VOCAB)


@REAL_DATA
def test_shipped_records_stay_reusable_under_the_new_key() -> None:
    """Records made before the key covered every input are read compatibly: their inputs are computed from what
    each record says it ran with (the vocab file its command names, its regime and spec), and equal what a run
    of the same spec computes today, so `final` and `tune` reuse them."""
    from benchmarks.convergence.parts import Parts
    from benchmarks.convergence.runner import RunSpec, recorded_inputs, run_inputs

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "convergence"
    checked = 0
    for path in sorted(results.glob("*/final/*.json")) + sorted(results.glob("*/tune/*.json")):
        old = json.loads(path.read_text())
        spec = RunSpec(**old["spec"])
        parts = Parts(folder=Path("unused"), source_sha256=old["parts_sha256"], units={})  # full-scale split
        assert recorded_inputs(old) == run_inputs(spec, REGIMES[spec.regime], parts, vocab=DEFAULT_VOCAB), path
        checked += 1
    assert checked >= 40


def test_final_json_names_every_input_it_ran_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """final.json's command once kept only --quick, --regimes and --seeds: a run on other --text, --vocab, --steps
    or --model-size was recorded as the default one."""
    calls, common = _fake_quick_study(tmp_path, monkeypatch)
    common += ["--steps", "6", "--model-size", "mini"]
    text, vocab = tmp_path / "text.txt", tmp_path / "vocab.txt"
    main(["tune", "--regime", "small", *common])
    result = main(["final", "--regimes", "small", *common])
    assert len(calls) == 4
    recorded = json.loads((tmp_path / "r" / "final.json").read_text())
    for given in (str(text), str(vocab), "--steps 6", "--model-size mini"):
        assert given in recorded["command"], given
    assert recorded["command"] == result["command"]


def test_same_day_pairs_only_records_of_one_machine_boot(tmp_path: Path) -> None:
    """A wall-time ratio across a restart measures the machine: a pair is reused only when both records exist,
    succeeded and name one boot id (older records, without one, never pair)."""
    from benchmarks.convergence.same_day import same_boot

    def write(name: str, **fields: Any) -> Path:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"error": None, **fields}))
        return path

    a, b = write("a", machine={"boot_id": "x"}), write("b", machine={"boot_id": "x"})
    assert same_boot([a, b])
    assert not same_boot([a, write("c", machine={"boot_id": "y"})])
    assert not same_boot([a, write("d", machine={})]) and not same_boot([a, tmp_path / "absent.json"])
    assert not same_boot([a, write("e", machine={"boot_id": "x"}, error="diverged")])


def test_a_pair_split_across_boots_keeps_this_boots_record_and_runs_only_the_other_again(tmp_path: Path) -> None:
    """Only what another boot made trains again: a record made on this boot stays (it would be the pair's twin), a
    pair made together on an earlier boot stays whole, a failed record goes."""
    from benchmarks.convergence.same_day import keep_this_boot

    def write(name: str, boot: str, error: str | None = None) -> Path:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"error": error, "machine": {"boot_id": boot}}))
        return path

    here, there = write("here", "now"), write("there", "before")
    keep_this_boot([here, there], boot="now")
    assert here.is_file() and not there.exists()
    keep_this_boot([here, tmp_path / "absent.json"], boot="now")
    assert here.is_file()
    old_a, old_b = write("old_a", "before"), write("old_b", "before")
    keep_this_boot([old_a, old_b], boot="now")
    assert old_a.is_file() and old_b.is_file()
    failed = write("failed", "now", error="killed")
    keep_this_boot([here, failed], boot="now")
    assert here.is_file() and not failed.exists()


def test_the_tuned_pair_takes_in_the_tuned_record_only_when_this_boot_made_it(tmp_path: Path) -> None:
    """--tuned: the `defaults` study's tuned K-FAC record, made on this boot, need not train again; one from another
    boot, or failed, is not taken (its time would not pair with LAMB's), and a pair's own record is never replaced."""
    from benchmarks.convergence.same_day import adopt_this_boot

    source, target = tmp_path / "final" / "kfac_seed1.json", tmp_path / "pair" / "kfac_seed1.json"
    source.parent.mkdir()
    source.write_text(json.dumps({"error": None, "final": 5.1, "machine": {"boot_id": "before"}}))
    adopt_this_boot(source, target, boot="now")
    assert not target.exists()
    source.write_text(json.dumps({"error": "killed", "machine": {"boot_id": "now"}}))
    adopt_this_boot(source, target, boot="now")
    assert not target.exists()
    source.write_text(json.dumps({"error": None, "final": 5.1, "machine": {"boot_id": "now"}}))
    adopt_this_boot(source, target, boot="now")
    assert json.loads(target.read_text())["final"] == 5.1
    source.write_text(json.dumps({"error": None, "final": 4.0, "machine": {"boot_id": "now"}}))
    adopt_this_boot(source, target, boot="now")
    assert json.loads(target.read_text())["final"] == 5.1


def test_same_day_reads_the_choice_from_the_results_folder_given(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """BERT-mini's study lives in its own results folder: --results is where chosen.json is looked for; --tuned
    against a LAMB-only choice says how to make the K-FAC one; --tuned with --tuned-lamb-shape is refused."""
    from benchmarks.convergence import same_day

    with pytest.raises(SystemExit):
        same_day.main(["--regime", "large", "--model-size", "mini", "--results", str(tmp_path)])
    assert str(tmp_path / "large" / "chosen.json") in capsys.readouterr().err
    (tmp_path / "large").mkdir()
    (tmp_path / "large" / "chosen.json").write_text(json.dumps({"lamb": {"lr": 0.01, "warmup": 0.2}, "kfac": None}))
    with pytest.raises(SystemExit):
        same_day.main(["--regime", "large", "--tuned", "--results", str(tmp_path)])
    assert "without --lamb-only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        same_day.main(["--regime", "large", "--tuned", "--tuned-lamb-shape", "--results", str(tmp_path)])
    assert "--tuned-lamb-shape" in capsys.readouterr().err


def test_same_day_without_a_tuned_choice_names_the_file_and_the_command(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.convergence import same_day

    monkeypatch.setattr(same_day, "shipped_results", lambda: tmp_path)
    with pytest.raises(SystemExit):
        same_day.main(["--regime", "small"])
    err = capsys.readouterr().err
    assert str(tmp_path / "small" / "chosen.json") in err and "benchmarks.convergence tune --regime small" in err


def test_a_time_ratio_across_machine_boots_is_flagged_in_the_rows_and_the_report() -> None:
    """`defaults` reuses LAMB's records from whatever boot made them; BERT-mini's tuned rows read 0.68 that way and
    0.82 paired on one boot: a row says whether its pair shares a boot, and the report names the command that pairs."""
    from benchmarks.convergence.ablation import report, seed_rows, summarise

    def record(seed: int, boot: str | None) -> dict[str, Any]:
        return {"spec": {"seed": seed, "steps": 20}, "train_seconds": 20.0, "final": 6.0, "machine": {"boot_id": boot},
                "curve": {"steps": [10.0, 20.0], "seconds": [10.0, 20.0], "values": [7.0, 6.0]}}

    rows = seed_rows([record(1, "a"), record(2, "a"), record(3, None)],
                     {"kfac": [record(1, "a"), record(2, "b"), record(3, None)]})
    assert [r["one_boot"] for r in rows] == [True, False, False]
    assert "same_day" in report({"rows": rows, "summary": summarise(rows)})
    assert "same_day" not in report({"rows": rows[:1], "summary": summarise(rows[:1])})


def test_ablation_measures_the_reach_of_lambs_best_as_well_as_its_final() -> None:
    """A LAMB whose held-out loss rises late hands out a 'win' against its final; its best loss must be reported
    too."""
    from benchmarks.convergence.ablation import seed_rows, summarise

    def record(seed: int, values: list[float]) -> dict[str, Any]:
        steps = [10.0 * (i + 1) for i in range(len(values))]
        return {"spec": {"seed": seed, "steps": 40}, "train_seconds": 40.0, "final": values[-1],
                "curve": {"steps": steps, "seconds": steps, "values": values}}

    lamb = [record(1, [7.0, 6.0, 6.5, 6.8])]  # best 6.0 at step 20, final 6.8
    kfac = [record(1, [7.2, 6.7, 6.2, 5.9])]
    rows = seed_rows(lamb, {"kfac": kfac})
    (row,) = rows
    assert row["lamb_best"] == 6.0 and row["lamb_steps_to_its_best"] == 20.0
    # 6.8 between 7.2 (step 10) and 6.7 (step 20): step 18, 0.45 of LAMB's 40 s
    assert row["to_lamb_final"]["step"] == pytest.approx(18.0)
    assert row["to_lamb_final"]["time_ratio"] == pytest.approx(0.45)
    assert row["to_lamb_best"]["step"] == pytest.approx(30 + 10 * (6.2 - 6.0) / (6.2 - 5.9))
    # against the time LAMB needed to reach its best (20 s), not its whole run: a LAMB stopped at its best
    assert row["to_lamb_best"]["time_ratio"] == pytest.approx(row["to_lamb_best"]["seconds"] / 20.0)
    assert row["to_lamb_best"]["step_ratio"] == pytest.approx(row["to_lamb_best"]["step"] / 20.0)
    best = summarise(rows)["kfac"]["to_lamb_best"]["time_ratio"]["mean"]
    assert best == pytest.approx(row["to_lamb_best"]["time_ratio"])
    never = seed_rows(lamb, {"kfac": [record(1, [7.2, 7.1, 7.0, 6.9])]})
    assert never[0]["to_lamb_final"]["step"] is None
    assert summarise(never)["kfac"]["to_lamb_final"]["time_ratio"]["missing"] == 1


def test_a_copy_of_lamb_reaches_lambs_best_in_lambs_own_time_not_in_less() -> None:
    """Time to LAMB's best counts against the time LAMB needed to reach it: measured against LAMB's whole run, a
    K-FAC that is LAMB step for step would 'reach LAMB's best in 0.5 of its time' whenever LAMB peaks halfway."""
    from benchmarks.convergence.ablation import seed_rows

    lamb = _record("lamb", 1, "report", [7.0, 6.0, 6.5, 6.8])
    (row,) = seed_rows([lamb], {"copy": [_record("lamb", 1, "report", [7.0, 6.0, 6.5, 6.8])]})
    assert row["to_lamb_best"]["time_ratio"] == pytest.approx(1.0)
    assert row["to_lamb_best"]["step_ratio"] == pytest.approx(1.0)
    assert row["to_lamb_final"]["time_ratio"] == pytest.approx(0.3)  # 6.8 first reached at step 12 of 40


def test_a_held_out_lead_is_split_into_faster_optimisation_and_a_smaller_generalisation_gap() -> None:
    """Item 2e: with the training part evaluated (dropout off), the report says how much of K-FAC's held-out lead is
    a lower training loss and how much a smaller held-out-minus-training gap (it was added up by hand before)."""
    from benchmarks.convergence.ablation import report, seed_rows, summarise

    def record(seed: int, heldout: list[float], train: list[float] | None) -> dict[str, Any]:
        steps = [10.0, 20.0, 30.0]
        return {"spec": {"seed": seed, "steps": 30}, "train_seconds": 30.0, "final": heldout[-1],
                "curve": {"steps": steps, "seconds": steps, "values": heldout},
                **({"train_eval_curve": {"steps": steps, "seconds": steps, "values": train}} if train else {})}

    # seed 1: LAMB 5.5 held-out over 3.8 training; K-FAC 5.0 over 4.0: lead 0.5 = -0.2 training + 0.7 gap
    # seed 2: K-FAC leads by 0.3, all of it a lower training loss (equal gaps of 1.0)
    lamb = [record(1, [7.0, 6.0, 5.5], [6.0, 4.5, 3.8]), record(2, [7.0, 6.0, 5.5], [6.0, 5.0, 4.5])]
    kfac = [record(1, [6.5, 5.5, 5.0], [5.5, 4.6, 4.0]), record(2, [6.5, 5.5, 5.2], [5.5, 5.1, 4.2])]
    rows = seed_rows(lamb, {"kfac": kfac})
    one, two = (r["generalisation"] for r in rows)
    assert one["train_lead"] == pytest.approx(-0.2) and one["gap_lead"] == pytest.approx(0.7)
    assert one["heldout_lead"] == pytest.approx(0.5) and one["gap_share"] == pytest.approx(1.4)
    assert one["train_below_share"] == pytest.approx(1 / 3)  # below LAMB's only at step 10
    assert two["gap_lead"] == pytest.approx(0.0) and two["gap_share"] == pytest.approx(0.0)
    assert two["train_below_share"] == pytest.approx(2 / 3)
    summary = summarise(rows)["kfac"]["generalisation"]
    assert summary["gap_share_of_mean_lead"] == pytest.approx(0.35 / 0.4)  # mean gap lead over mean held-out lead
    assert "share from the gap 88%" in report({"rows": rows, "summary": summarise(rows)})
    # a higher training loss with a held-out lead: the gap is all of it, not "1015%" of a 0.02 lead
    behind = seed_rows([lamb[0]], {"kfac": [record(1, [6.5, 5.5, 5.48], [5.5, 4.6, 4.1])]})
    assert "all of it (the training loss is higher" in report({"rows": behind, "summary": summarise(behind)})
    # without the training part's evaluations (either run) there is nothing to split, and the report says nothing
    plain = seed_rows([record(1, [7.0, 6.0, 5.5], None)], {"kfac": [kfac[0]]})
    assert "generalisation" not in plain[0] and "generalisation" not in summarise(plain)["kfac"]
    assert "dropout off" not in report({"rows": plain, "summary": summarise(plain)})


def test_a_defaults_run_is_not_reused_after_the_library_defaults_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """A defaults run's section is ``{"enabled": true}`` whatever the defaults are, so its key must carry the
    library's defaults themselves: otherwise a record made at the old defaults is reused as if made at the new
    ones. Runs that set the changed key themselves (tuned K-FAC, a candidate) keep their key."""
    import dataclasses

    from benchmarks.convergence.parts import Parts
    from benchmarks.convergence.runner import RunSpec, run_inputs
    from kaisa_ds.config import KFACConfig
    from kaisa_ds.engine import ds_config

    @dataclasses.dataclass
    class NewDefaults(KFACConfig):
        inv_update_steps: Any = 37

    regime = REGIMES["large"]
    parts = Parts(folder=Path("unused"), source_sha256="x", units={})
    spec = RunSpec(name="defaults_seed1", regime="large", optimizer=LIBRARY_DEFAULTS, lr=0.02, warmup=0.2,
                   steps=450, seed=1, eval_part="report", kfac={})
    tuned = RunSpec(name="kfac_seed1", regime="large", optimizer="kfac", lr=0.02, warmup=0.2, steps=450, seed=1,
                    eval_part="report", kfac={"damping": 1e-6, "factor_update_steps": 1, "inv_update_steps": 10})
    candidate = dataclasses.replace(spec, name="defaults_inv_update_steps50_seed1", kfac={"inv_update_steps": 50})
    before = [run_inputs(s, regime, parts, vocab=DEFAULT_VOCAB) for s in (spec, tuned, candidate)]
    monkeypatch.setattr(ds_config, "KFACConfig", NewDefaults)  # what the run's engine builds its config with
    after = [run_inputs(s, regime, parts, vocab=DEFAULT_VOCAB) for s in (spec, tuned, candidate)]
    assert after[0] != before[0]
    assert after[1:] == before[1:]  # a section that sets the changed key trained the same either way


def test_a_defaults_record_carries_the_damping_its_grafting_resolves_to() -> None:
    """The default relative damping follows ``grafting`` (defaults_rule_7.md), so a defaults run's key holds the value
    in force, resolved with the section's own keys: otherwise a run at one grafting reuses a record made at the other's
    damping. Records made before rule 7 stored None, which meant 100 whatever the grafting; absolute damping has none
    (None)."""
    from benchmarks.convergence.runner import damping_before_rule_7, library_defaults
    from kaisa_ds.config import KFACConfig

    plain, kaisa = library_defaults(section={}), library_defaults(section={"grafting": "none"})
    assert plain["relative_damping"] == KFACConfig().damping_at(0).value
    assert kaisa["relative_damping"] == KFACConfig(grafting="none").damping_at(0).value != plain["relative_damping"]
    assert kaisa["kl_clip"] == KFACConfig(grafting="none").value("kl_clip", 0) != plain["kl_clip"]  # "auto" resolved
    assert plain["kl_clip"] == KFACConfig().value("kl_clip", 0)
    assert "relative_damping" not in library_defaults(section={"relative_damping": 10})
    assert library_defaults(section={"damping": 1e-6})["relative_damping"] is None
    old = {"ds_config": {"kfac": {"enabled": True, "grafting": "gradient", "kl_clip": None}},
           "library_defaults": {"damping": None, "relative_damping": None, "damping_mode": None}}
    assert damping_before_rule_7(old)["library_defaults"]["relative_damping"] == 100.0
    assert damping_before_rule_7(old)["library_defaults"]["relative_damping"] != plain["relative_damping"]
    absolute = {"ds_config": {"kfac": {"enabled": True, "damping": 1e-6}},
                "library_defaults": {"relative_damping": None, "damping_mode": None}}
    assert damping_before_rule_7(absolute) == absolute


def test_candidate_defaults_run_on_the_tune_part_at_the_seeds_asked_for_beside_lamb_at_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate was compared on the tuning seed only, and one seed chose a default that the report part then
    showed worse (defaults_rule_2.md). With --seeds, each seed's candidate run sits beside LAMB's chosen tuning
    settings at that seed; the tuning seed's LAMB run keeps the name the tuning sweep gave it (reused)."""
    from benchmarks.convergence import defaults as defaults_study

    ran: list[tuple[str, int, str, str]] = []

    def fake_run(spec: Any, regime: Any, parts: Any, *, record: Path, **_: Any) -> dict[str, Any]:
        ran.append((spec.name, spec.seed, spec.eval_part, record.parent.name))
        return {"spec": {"seed": spec.seed, "steps": spec.steps}, "final": 5.0, "train_seconds": 1.0,
                "curve": {"steps": [1.0], "seconds": [1.0], "values": [5.0]}}

    monkeypatch.setattr(defaults_study, "run", fake_run)
    lamb = {"lr": 0.01, "warmup": 0.1}
    defaults_study.defaults(regime=REGIMES["small"], parts=None, chosen={"lamb": lamb, "kfac": lamb}, seeds=[0, 1],
                            vocab=tmp_path, work=tmp_path, out=tmp_path, info={}, part="tune",
                            extra={"inv_update_steps": 10})
    assert sorted(ran) == [("defaults_inv_update_steps10_seed0", 0, "tune", "defaults_tune"),
                           ("defaults_inv_update_steps10_seed1", 1, "tune", "defaults_tune"),
                           ("lamb_lr0.01_warmup0.1", 0, "tune", "tune"),
                           ("lamb_lr0.01_warmup0.1_seed1", 1, "tune", "tune")]
    written = json.loads((tmp_path / "defaults_tune.json").read_text())["defaults_inv_update_steps10"]
    assert written["seeds"] == [0, 1] and [r["seed"] for r in written["rows"]] == [0, 1]


def test_lamb_shape_trains_each_degree_and_weight_decay_reusing_the_shipped_point_and_chooses_the_lowest_mean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23, 2b: LAMB's schedule shape and weight decay are tuned on the tune part. The grid point equal to the
    shipped config is the lr/warmup tuning's own run (its name, so its record is reused); the others train with
    their degree and weight decay in the DeepSpeed config; the lowest mean final over the seeds is chosen."""
    from benchmarks.convergence import lamb_shape as study

    finals = {(0.5, 0.01): [5.3, 5.5], (0.5, 0.1): [5.2, 5.7], (1.0, 0.01): [5.25, 5.35], (1.0, 0.1): [5.4, 5.4]}
    ran: list[tuple[str, dict[str, Any]]] = []

    def fake_run(spec: Any, regime: Any, parts: Any, *, record: Path, **_: Any) -> dict[str, Any]:
        cfg = spec.ds_config(regime)
        shape = (cfg["lr_schedule"]["degree"], cfg["optimizer"]["params"]["weight_decay"])
        ran.append((spec.name, cfg))
        final = finals[shape][spec.seed]
        return {"spec": spec.key(), "final": final, "curve": {"steps": [1, 2], "seconds": [1, 2],
                                                              "values": [final + 1, final]}}

    monkeypatch.setattr(study, "run", fake_run)
    result = study.lamb_shape(regime=REGIMES["small"], parts=None, chosen={"lamb": {"lr": 0.01, "warmup": 0.02}},
                              seeds=[0, 1], vocab=tmp_path, work=tmp_path, out=tmp_path, info={})
    names = sorted({name for name, _ in ran})
    assert names == ["lamb_lr0.01_warmup0.02", "lamb_lr0.01_warmup0.02_degree1",
                     "lamb_lr0.01_warmup0.02_degree1_seed1", "lamb_lr0.01_warmup0.02_degree1_weight_decay0.1",
                     "lamb_lr0.01_warmup0.02_degree1_weight_decay0.1_seed1", "lamb_lr0.01_warmup0.02_seed1",
                     "lamb_lr0.01_warmup0.02_weight_decay0.1", "lamb_lr0.01_warmup0.02_weight_decay0.1_seed1"]
    assert all(cfg["optimizer"]["params"]["lr"] == 0.01 and cfg["lr_schedule"]["warmup_proportion"] == 0.02
               for _, cfg in ran)
    assert result["chosen"] == {"degree": 1.0, "weight_decay": 0.01, "use_nvlamb": False, "max_grad_norm": 1.0,
                                "eps": 1e-6}
    assert result["changes_lamb"]
    assert json.loads((tmp_path / "lamb_shape.json").read_text())["chosen"] == result["chosen"]  # mean 5.30
    assert (tmp_path / "lamb_shape.png").stat().st_size > 0
    # NVLAMB as a third axis: its runs carry use_nvlamb, the shipped point is reused, the first summary is kept
    ran.clear()
    finals.update({(0.5, 0.01, True): [5.1, 5.2]})

    def fake_run_nv(spec: Any, regime: Any, parts: Any, **_: Any) -> dict[str, Any]:
        cfg = spec.ds_config(regime)
        params = cfg["optimizer"]["params"]
        ran.append((spec.name, cfg))
        key = (cfg["lr_schedule"]["degree"], params["weight_decay"], params.get("use_nvlamb", False))
        final = finals[key if key[2] else key[:2]][spec.seed]
        return {"spec": spec.key(), "final": final, "curve": {"steps": [1], "seconds": [1], "values": [final]}}

    monkeypatch.setattr(study, "run", fake_run_nv)
    nv = study.lamb_shape(regime=REGIMES["small"], parts=None, chosen={"lamb": {"lr": 0.01, "warmup": 0.02}},
                          seeds=[0, 1], vocab=tmp_path, work=tmp_path, out=tmp_path, info={}, degrees=(0.5,),
                          weight_decays=(0.01,), extra_axes={"use_nvlamb": (False, True)})
    assert sorted(name for name, _ in ran) == ["lamb_lr0.01_warmup0.02", "lamb_lr0.01_warmup0.02_seed1",
                                               "lamb_lr0.01_warmup0.02_use_nvlamb1",
                                               "lamb_lr0.01_warmup0.02_use_nvlamb1_seed1"]
    assert nv["chosen"]["use_nvlamb"] is True and nv["written"] == ["lamb_shape_nvlamb.json", "lamb_shape_nvlamb.png"]
    assert json.loads((tmp_path / "lamb_shape.json").read_text())["chosen"] == result["chosen"]


def test_lamb_shape_max_grad_norm_axis_trains_lamb_without_the_pre_normalisation_into_a_summary_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for K-FAC under ``--lamb-set max_grad_norm=0``: LAMB itself without the global-norm
    pre-normalisation. The shipped threshold is the tuning's own run (reused by name, no key in its config); the
    0 point puts max_grad_norm 0 in LAMB's params; the first study's summary is kept."""
    from benchmarks.convergence import lamb_shape as study

    (tmp_path / "lamb_shape.json").write_text(json.dumps({"chosen": "the first study's"}))
    ran: dict[str, dict[str, Any]] = {}

    def fake_run(spec: Any, regime: Any, parts: Any, **_: Any) -> dict[str, Any]:
        params = spec.ds_config(regime)["optimizer"]["params"]
        ran[spec.name] = params
        final = 5.2 if params.get("max_grad_norm", 1.0) == 0 else 5.4
        return {"spec": spec.key(), "final": final, "curve": {"steps": [1], "seconds": [1], "values": [final]}}

    monkeypatch.setattr(study, "run", fake_run)
    result = study.lamb_shape(regime=REGIMES["large"], parts=None, chosen={"lamb": {"lr": 0.02, "warmup": 0.2}},
                              seeds=[0, 1], vocab=tmp_path, work=tmp_path, out=tmp_path, info={}, degrees=(0.5,),
                              weight_decays=(0.01,), extra_axes={"max_grad_norm": (1.0, 0.0)})
    assert sorted(ran) == ["lamb_lr0.02_warmup0.2", "lamb_lr0.02_warmup0.2_max_grad_norm0",
                           "lamb_lr0.02_warmup0.2_max_grad_norm0_seed1", "lamb_lr0.02_warmup0.2_seed1"]
    assert "max_grad_norm" not in ran["lamb_lr0.02_warmup0.2"] and ran["lamb_lr0.02_warmup0.2_max_grad_norm0"][
        "max_grad_norm"] == 0
    assert result["chosen"]["max_grad_norm"] == 0 and result["written"] == ["lamb_shape_max_grad_norm.json",
                                                                            "lamb_shape_max_grad_norm.png"]
    assert json.loads((tmp_path / "lamb_shape.json").read_text())["chosen"] == "the first study's"


def test_lamb_shape_eps_axis_puts_adams_epsilon_in_lambs_params_and_other_axes_are_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adam's epsilon as an axis (does a LAMB whose small gradients get steps proportional to them, not normalised
    per element, get K-FAC's early lead?); an axis outside the known keys is refused before any run."""
    from benchmarks.convergence import cli
    from benchmarks.convergence import lamb_shape as study

    ran: dict[str, dict[str, Any]] = {}

    def fake_run(spec: Any, regime: Any, parts: Any, **_: Any) -> dict[str, Any]:
        ran[spec.name] = spec.ds_config(regime)["optimizer"]["params"]
        return {"spec": spec.key(), "final": 5.0, "curve": {"steps": [1], "seconds": [1], "values": [5.0]}}

    monkeypatch.setattr(study, "run", fake_run)
    args = cli.build_parser().parse_args(["lamb-shape", "--regime", "large", "--eps", "1e-6", "1e-3"])
    axes = cli.extra_lamb_axes(args)
    assert axes == {"eps": (1e-6, 1e-3)}
    result = study.lamb_shape(regime=REGIMES["large"], parts=None, chosen={"lamb": {"lr": 0.02, "warmup": 0.2}},
                              seeds=[0], vocab=tmp_path, work=tmp_path, out=tmp_path, info={}, degrees=(0.5,),
                              weight_decays=(0.01,), extra_axes=axes)
    assert sorted(ran) == ["lamb_lr0.02_warmup0.2", "lamb_lr0.02_warmup0.2_eps0.001"]
    assert "eps" not in ran["lamb_lr0.02_warmup0.2"] and ran["lamb_lr0.02_warmup0.2_eps0.001"]["eps"] == 1e-3
    assert [row["eps"] for row in result["rows"]] == [1e-6, 1e-3] and (tmp_path / "lamb_shape_eps.json").is_file()
    with pytest.raises(ValueError, match="beta1"):
        study.lamb_shape(regime=REGIMES["large"], parts=None, chosen={"lamb": {"lr": 0.02, "warmup": 0.2}},
                         seeds=[0], vocab=tmp_path, work=tmp_path, out=tmp_path, info={}, extra_axes={"beta1": (0.8,)})


def test_a_lamb_shape_key_outside_the_known_ones_is_refused_by_name() -> None:
    from benchmarks.convergence.regimes import ds_config

    with pytest.raises(ValueError, match="'beta1'"):
        ds_config(REGIMES["small"], lr=0.01, warmup=0.1, steps=10, kfac=None, lamb_shape={"beta1": 0.8})


def test_same_day_at_the_tuned_lamb_shape_trains_both_optimizers_at_it_into_their_own_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23, 2b: if LAMB's tuning of its schedule shape changes LAMB, the ratios must be measured against that
    LAMB, with K-FAC preconditioning the same LAMB; the shipped pairs' records stay where they are."""
    from benchmarks.convergence import same_day

    out = tmp_path / "small"
    out.mkdir()
    (out / "chosen.json").write_text(json.dumps({"lamb": {"lr": 0.01, "warmup": 0.02}}))
    monkeypatch.setattr(same_day, "shipped_results", lambda: tmp_path)
    monkeypatch.setattr(same_day, "write_parts", lambda *a, **k: None)
    with pytest.raises(SystemExit, match="lamb-shape --regime small"):
        same_day.main(["--regime", "small", "--tuned-lamb-shape"])
    (out / "lamb_shape.json").write_text(json.dumps({"chosen": {"degree": 0.5, "weight_decay": 0.01}}))
    with pytest.raises(SystemExit, match="shipped shape"):
        same_day.main(["--regime", "small", "--tuned-lamb-shape"])
    (out / "lamb_shape.json").write_text(json.dumps({"chosen": {"degree": 0.5, "weight_decay": 0.1}}))
    ran: list[tuple[str, Path, dict[str, Any]]] = []

    def fake_run(spec: Any, regime: Any, parts: Any, *, record: Path, **_: Any) -> dict[str, Any]:
        ran.append((spec.name, record.parent, spec.ds_config(regime)))
        return {"spec": spec.key(), "final": 5.0, "train_seconds": 1.0,
                "curve": {"steps": [1.0], "seconds": [1.0], "values": [5.0]}}

    monkeypatch.setattr(same_day, "run", fake_run)
    monkeypatch.setattr(same_day, "plot_train_heldout", lambda *a, **k: None)
    result = same_day.main(["--regime", "small", "--seeds", "1", "--tuned-lamb-shape"])
    assert [(n, folder.name) for n, folder, _ in ran] == [("lamb_seed1", "same_day_lamb_shape"),
                                                          ("defaults_seed1", "same_day_lamb_shape")]
    assert all(cfg["optimizer"]["params"]["weight_decay"] == 0.1 and cfg["lr_schedule"]["degree"] == 0.5
               for _, _, cfg in ran)
    assert ran[1][2]["kfac"] == {"enabled": True}
    assert result["lamb_shape"] == {"weight_decay": 0.1} and (out / "defaults_same_day_lamb_shape.json").is_file()


def test_the_training_beside_held_out_plot_shows_every_curve_down_to_its_lowest_point(tmp_path: Path) -> None:
    """BERT-mini's dropout-off training curves end at 4.26-4.33, below the plot's old fixed floor of 4.5: the curves
    that tell optimisation from generalisation were cut off where they differ."""
    from benchmarks.convergence.plots import loss_range, plot_train_heldout

    low, high = loss_range([[10.3, 6.0, 4.47], [7.1, 5.0, 4.26]])
    assert low < 4.26 and high == 8.0
    assert loss_range([[6.0, 5.5]]) == pytest.approx((5.4, 6.1))  # all below the ceiling: no empty band above
    steps = [10.0, 20.0, 30.0]
    record = {"spec": {"seed": 1}, "curve": {"steps": steps, "seconds": steps, "values": [7.0, 5.5, 5.2]},
              "train_eval_curve": {"steps": steps, "seconds": steps, "values": [6.9, 4.8, 4.26]}}
    plot_train_heldout({"lamb": [record]}, title="t", out=tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _fake_same_day(results: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float | None]]:
    """``same_day`` on ``results/large`` with LAMB's choice, this boot "now", and a ``run`` that trains nothing: it
    reuses a record that is there (or writes a new one) and notes ``(run name, the final it found)`` in the list."""
    from benchmarks.convergence import same_day

    (results / "large" / "chosen.json").write_text(json.dumps({"lamb": {"lr": 0.01, "warmup": 0.2}}))
    monkeypatch.setattr(same_day, "shipped_results", lambda: results)
    monkeypatch.setattr(same_day, "write_parts", lambda *a, **k: None)
    monkeypatch.setattr(same_day, "plot_train_heldout", lambda *a, **k: None)
    monkeypatch.setattr(same_day, "machine", lambda: {"boot_id": "now"})
    seen: list[tuple[str, float | None]] = []

    def fake_run(spec: Any, regime: Any, parts: Any, *, record: Path, machine: dict[str, Any],
                 **_: Any) -> dict[str, Any]:
        old = json.loads(record.read_text()) if record.is_file() else None
        seen.append((spec.name, old and old["final"]))
        new = old or {"spec": spec.key(), "final": 5.0, "train_seconds": 1.0, "error": None, "machine": machine,
                      "curve": {"steps": [1.0], "seconds": [1.0], "values": [5.0]}}
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(new))
        return dict(new)

    monkeypatch.setattr(same_day, "run", fake_run)
    return seen


def test_a_defaults_pair_takes_in_lambs_record_from_the_tuned_pair_made_on_this_boot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LAMB's final run is the same in the defaults pair and the tuned pair (--eval-train too): after one kind of
    pair ran, the other trains only its K-FAC run on the same boot; a LAMB record from another boot is not taken."""
    from benchmarks.convergence import same_day

    out = tmp_path / "large"
    (out / "same_day_train_eval_tuned").mkdir(parents=True)
    seen = _fake_same_day(tmp_path, monkeypatch)
    twin = out / "same_day_train_eval_tuned" / "lamb_seed1.json"

    def lamb_record(boot: str) -> str:
        return json.dumps({"spec": {"seed": 1, "steps": 1}, "final": 5.25, "train_seconds": 1.0, "error": None,
                           "machine": {"boot_id": boot}, "curve": {"steps": [1.0], "seconds": [1.0], "values": [5.25]}})

    twin.write_text(lamb_record("before"))
    same_day.main(["--regime", "large", "--seeds", "1", "--eval-train"])
    assert seen == [("lamb_seed1", None), ("defaults_seed1", None)]  # another boot's LAMB: trained here
    (out / "same_day_train_eval" / "lamb_seed1.json").unlink()
    (out / "same_day_train_eval" / "defaults_seed1.json").unlink()
    twin.write_text(lamb_record("now"))
    seen.clear()
    same_day.main(["--regime", "large", "--seeds", "1", "--eval-train"])
    assert seen == [("lamb_seed1", 5.25), ("defaults_seed1", None)]  # this boot's twin offered to `run` for reuse


def test_a_stale_record_pairs_with_nothing_so_another_boots_lamb_is_not_timed_against_its_rerun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's defaults changed, so an earlier boot's defaults record is stale and trains again here. Its LAMB
    twin from that boot once stayed (the two had made a whole pair) and was timed against the new K-FAC run: a
    ratio across boots. LAMB must come from this boot: trained again, or taken from the tuned pair's folder."""
    from benchmarks.convergence import same_day

    out = tmp_path / "large"
    pair, twin = out / "same_day", out / "same_day_tuned"
    twin.mkdir(parents=True)
    pair.mkdir()
    seen = _fake_same_day(tmp_path, monkeypatch)
    # the defaults record was made with other library defaults; every LAMB record with LAMB's own inputs
    monkeypatch.setattr(same_day, "reusable", lambda spec, *a, record, **k: (
        None if spec.name.startswith("defaults") else json.loads(record.read_text())))

    def record(final: float, boot: str) -> str:
        curve = {"steps": [1.0], "seconds": [1.0], "values": [final]}
        return json.dumps({"spec": {"seed": 1, "steps": 1}, "final": final, "train_seconds": 1.0, "error": None,
                           "machine": {"boot_id": boot}, "curve": curve})

    def stale_pair_of_an_earlier_boot() -> None:
        (pair / "lamb_seed1.json").write_text(record(5.25, "before"))
        (pair / "defaults_seed1.json").write_text(record(5.4, "before"))

    stale_pair_of_an_earlier_boot()
    same_day.main(["--regime", "large", "--seeds", "1"])
    assert seen == [("lamb_seed1", None), ("defaults_seed1", None)]  # both train on this boot
    stale_pair_of_an_earlier_boot()
    (twin / "lamb_seed1.json").write_text(record(5.1, "now"))
    seen.clear()
    same_day.main(["--regime", "large", "--seeds", "1"])
    assert seen == [("lamb_seed1", 5.1), ("defaults_seed1", None)]  # this boot's LAMB from the tuned pair


def test_replot_rewrites_the_report_from_the_pair_records_without_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Records from an earlier boot are kept by --replot (a normal call would train them again), the report gains
    what the code now computes from them, and the machine it names stays the one the pairs ran on."""
    from benchmarks.convergence import same_day

    out = tmp_path / "small"
    folder = out / "same_day_train_eval"
    folder.mkdir(parents=True)
    (out / "chosen.json").write_text(json.dumps({"lamb": {"lr": 0.01, "warmup": 0.2}}))
    monkeypatch.setattr(same_day, "shipped_results", lambda: tmp_path)
    monkeypatch.setattr(same_day, "write_parts", lambda *a, **k: None)
    monkeypatch.setattr(same_day, "run", lambda *a, **k: pytest.fail("--replot trained a run"))
    with pytest.raises(SystemExit):
        same_day.main(["--regime", "small", "--seeds", "1", "--eval-train", "--replot"])
    assert str(folder / "lamb_seed1.json") in capsys.readouterr().err
    steps = [10.0, 20.0]
    for name, heldout, train in (("lamb", [6.0, 5.5], [5.0, 4.0]), ("defaults", [5.8, 5.1], [5.1, 4.1])):
        (folder / f"{name}_seed1.json").write_text(json.dumps(
            {"spec": {"seed": 1, "steps": 20}, "final": heldout[-1], "train_seconds": 20.0, "error": None,
             "machine": {"boot_id": "before"}, "curve": {"steps": steps, "seconds": steps, "values": heldout},
             "train_eval_curve": {"steps": steps, "seconds": steps, "values": train}}))
    (out / "defaults_same_day_train_eval.json").write_text(json.dumps({"machine": {"boot_id": "before"}}))
    result = same_day.main(["--regime", "small", "--seeds", "1", "--eval-train", "--replot"])
    assert result["rows"][0]["generalisation"]["gap_lead"] == pytest.approx(0.5)
    assert result["machine"] == {"boot_id": "before"}
    assert (folder / "lamb_seed1.json").is_file() and (out / "defaults_same_day_train_eval_train_heldout.png").is_file()


@REAL_DATA
def test_transfer_case_refuses_what_is_not_a_transfer(tmp_path: Path) -> None:
    """``defaults --chosen-from``: a choice tuned on another text family is the transfer case; the same text, the
    tune part, a missing file or the choice's own results folder are refused before anything trains."""
    from benchmarks.convergence import cli

    args = cli.build_parser().parse_args(["defaults", "--regime", "small", *_common(tmp_path)])
    cli.resolve_folders(args)
    regime = cli.regime_of("small", args)
    wiki = cli.parts_of(args, regime)  # the small regime's own text: WikiText-2
    tuned_at = scale_of(regime, quick_scale=True, parts=wiki, vocab=DEFAULT_VOCAB)
    chosen = {"tuned_at": tuned_at, "lamb": {"lr": 0.01, "warmup": 0.1},
              "kfac": {"lr": 0.015, "warmup": 0.1, "damping": 0.01, "factor_every": 1, "inv_every": 2}}
    tuned_dir = tmp_path / "tuned_on_wikitext" / "small"
    tuned_dir.mkdir(parents=True)
    (tuned_dir / "chosen.json").write_text(json.dumps(chosen))
    transfer = ["defaults", "--regime", "small", "--chosen-from", str(tuned_dir / "chosen.json"), *_common(tmp_path)]
    with pytest.raises(SystemExit, match="needs --text"):
        main(transfer)  # the regime's own text
    with pytest.raises(SystemExit, match="tuned on this very text"):
        main([*transfer, "--text", str(DEFAULT_TEXT)])  # WikiText again: no transfer
    with pytest.raises(SystemExit, match="leave out --part tune"):
        main([*transfer, "--part", "tune", "--text", str(SQUAD)])
    with pytest.raises(SystemExit, match="does not exist"):
        main(["defaults", "--regime", "small", "--chosen-from", str(tmp_path / "none.json"), "--text", str(SQUAD),
              *_common(tmp_path)])
    with pytest.raises(SystemExit, match="own results folder"):
        main(["defaults", "--regime", "small", "--chosen-from", str(tuned_dir / "chosen.json"), "--text",
              str(SQUAD), "--quick", "--work", str(tmp_path / "work"), "--results", str(tuned_dir.parent)])
    # the SQuAD contexts are another family: accepted and recorded (the runs themselves are the slow test's)
    squad_args = cli.build_parser().parse_args([*transfer, "--text", str(SQUAD)])
    cli.resolve_folders(squad_args)
    got = cli.load_chosen(regime, cli.parts_of(squad_args, regime), squad_args)
    record = json.loads((tmp_path / "results" / "small" / "transfer.json").read_text())
    assert got["lamb"] == chosen["lamb"] and record["tuned_sources_sha256"] == wiki.source_sha256
    assert record["report_sources_sha256"] != wiki.source_sha256 and record["report_texts"] == [str(SQUAD)]


def test_lamb_only_tuning_is_all_the_defaults_study_needs_and_later_tuning_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23: K-FAC at its defaults takes only LAMB's tuned lr and warmup, yet `defaults` once needed the whole
    K-FAC grid tuned first (8 more runs on BERT-mini before its first report-part figure). `tune --lamb-only`
    records LAMB's choice alone; `defaults` then trains LAMB and the defaults only; studies that need the tuned
    K-FAC say which command records it; a later full `tune` reuses the LAMB runs and adds the K-FAC choice, which a
    rerun with --lamb-only refuses to drop."""
    calls, common = _fake_quick_study(tmp_path, monkeypatch)

    def kfac_launches() -> int:
        return sum("kfac" in json.dumps(json.loads(Path(a[a.index("--config") + 1]).read_text())) for a in calls)

    chosen = main(["tune", "--regime", "small", "--lamb-only", *common])
    assert chosen["kfac"] is None and set(chosen["budget"]) == {"lamb"} and kfac_launches() == 0
    assert not (tmp_path / "r" / "small" / "chosen_kfac_ds_config.json").exists()
    lamb_launches = len(calls)
    result = main(["defaults", "--regime", "small", *common])
    assert result["tuned_kfac"] is None and all("tuned" not in row for row in result["rows"])
    assert sorted(p.name for p in (tmp_path / "r" / "small").rglob("*_seed1.json")) == [
        "defaults_seed1.json", "lamb_seed1.json"]
    assert len(calls) == lamb_launches + 2 and kfac_launches() == 1  # LAMB's final and the defaults run
    with pytest.raises(SystemExit, match="--lamb-only"):
        main(["final", "--regimes", "small", *common])
    full = main(["tune", "--regime", "small", *common])
    assert full["kfac"] is not None and full["lamb"] == chosen["lamb"]
    assert kfac_launches() == 2 and len(calls) == lamb_launches + 3  # the quick K-FAC grid's 1 run; LAMB reused
    with pytest.raises(SystemExit, match="K-FAC choice"):
        main(["tune", "--regime", "small", "--lamb-only", *common])
    assert json.loads((tmp_path / "r" / "small" / "chosen.json").read_text())["kfac"] == full["kfac"]


def test_a_choice_on_the_grids_edge_is_named_with_the_flag_that_extends_it() -> None:
    """BERT-mini's LAMB tuning chose lr 0.01 at warmup 0.2: the smallest lr and the longest warmup tried, so a
    better baseline may lie outside the grid. The edges of the chosen point, along each axis among the points that
    share its other settings, are named; a point inside the grid has none."""
    tried = [{"lr": lr, "warmup": w} for lr in (0.01, 0.02, 0.03) for w in (0.05, 0.2)]
    edges = analysis.grid_edges({"lr": 0.01, "warmup": 0.2}, tried)
    assert len(edges) == 2 and all("--lamb-points" in e for e in edges)
    assert "lr 0.01" in edges[0] and "smallest" in edges[0] and "warmup 0.2" in edges[1] and "largest" in edges[1]
    inner = tried + [{"lr": 0.02, "warmup": 0.4}]
    assert analysis.grid_edges({"lr": 0.02, "warmup": 0.2}, inner) == []
    assert analysis.grid_edges({"lr": 0.01}, [{"lr": 0.01}])[0].startswith("lr 0.01 is the only value tried")


def test_extra_lamb_points_join_the_grid_the_choice_and_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    calls, common = _fake_quick_study(tmp_path, monkeypatch)
    chosen = main(["tune", "--regime", "small", "--lamb-only", "--lamb-points", "0.001:0.3", *common])
    lrs = [json.loads(Path(a[a.index("--config") + 1]).read_text())["optimizer"]["params"]["lr"] for a in calls]
    assert lrs == [REGIMES["small"].lamb_lrs[0], 0.001]
    assert chosen["budget"]["lamb"]["runs"] == 2 and {r["lr"] for r in chosen["runs"]} == set(lrs)
    assert chosen["lamb"]["lr"] == REGIMES["small"].lamb_lrs[0]  # equal finals: the first, the regime's own
    assert chosen["lamb_grid_edges"] == analysis.grid_edges(chosen["lamb"], [{"lr": r["lr"], "warmup": r["warmup"]}
                                                                             for r in chosen["runs"]])
    with pytest.raises(SystemExit):
        main(["tune", "--regime", "small", "--lamb-points", "0.01", *common])
    assert "'0.01': give LR:WARMUP" in capsys.readouterr().err


def test_a_list_setting_names_its_record_in_plain_characters() -> None:
    """Rule 4's `--set 'skip_layers=[...]'` named its records `defaults_skip_layers['embeddings', 'cls', ...]`:
    brackets, quotes and spaces in a file name every shell command then has to quote."""
    import re

    from benchmarks.convergence.defaults import candidate_name

    name = candidate_name({"skip_layers": ["embeddings", "cls", "pooler"], "inv_update_steps": 10})
    assert re.fullmatch(r"[A-Za-z0-9_.+-]+", name), name
    assert "embeddings" in name and "pooler" in name and "inv_update_steps10" in name
    assert candidate_name({"skip_layers": ["cls"]}) != candidate_name({"skip_layers": ["cls", "pooler"]})


def test_ablation_variants_change_only_the_step_they_name() -> None:
    from benchmarks.convergence.ablation import variant_kfac

    tuned = {"damping": 1e-6, "kl_clip": 0.001, "factor_update_steps": 1}
    assert variant_kfac(tuned, variant="identity", damping=2.0) == ("identity_damping2", {**tuned, "damping": 2.0})
    assert variant_kfac(tuned, variant="kfac-size", damping=2.0)[1] == {**tuned, "grafting": "kfac-size"}
    assert variant_kfac(tuned, variant="gradient", damping=2.0)[1] == {**tuned, "grafting": "gradient",
                                                                        "kl_clip": None}
    with pytest.raises(ValueError, match=r"'size'.*identity, kfac-size, gradient"):
        variant_kfac(tuned, variant="size", damping=2.0)


def test_size_direction_reads_the_recorded_variants_and_leaves_out_missing_ones(tmp_path: Path) -> None:
    from benchmarks.convergence import size_direction

    def write(stem: str, seed: int, values: list[float]) -> None:
        path = tmp_path / "small" / (f"{stem}.json" if stem.startswith("tune/") and seed == 0 else
                                     f"{stem}_seed{seed}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        steps = [50, 250, 750, 1000, 1500]
        path.write_text(json.dumps({"final": values[-1], "spec": {"seed": seed},
                                    "curve": {"steps": steps, "seconds": steps, "values": values}}))

    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "chosen.json").write_text(json.dumps({"lamb": {"lr": 0.01, "warmup": 0.02}}))
    lamb, defaults = "tune/lamb_lr0.01_warmup0.02", size_direction.DEFAULTS_STEMS["small"]
    for seed in (0, 1):
        write(lamb, seed, [7.8, 6.2, 5.5, 5.5, 5.3 + seed])
        write(defaults, seed, [6.9, 6.3, 5.7, 5.4, 5.0])
        write("defaults_tune/defaults_graftingkfac-size", seed, [6.8, 6.3, 6.0, 5.9, 5.45])
    found = size_direction.main(["--regime", "small", "--results", str(tmp_path)])
    assert [r["variant"][:2] for r in found] == ["LA", "E:", "S:"]  # G has no records: left out
    assert found[0]["final"] == "5.300 / 6.300" and found[2]["step 750"] == "6.00 / 6.00"
    assert (tmp_path / "small" / "grafting_tune.png").stat().st_size > 10_000
    for seed in (0, 1):  # a study whose E ran as the plain library defaults of its day names its own stem
        write("defaults_tune/defaults", seed, [6.9, 6.3, 5.7, 5.4, 4.9])
    (tmp_path / "small" / f"{defaults}_seed0.json").unlink()
    found = size_direction.main(["--regime", "small", "--results", str(tmp_path), "--e-stem", "defaults_tune/defaults"])
    assert found[1]["variant"][:2] == "E:" and found[1]["final"] == "4.900 / 4.900"


def test_a_defaults_run_can_change_lamb_under_kfac_and_is_named_for_it() -> None:
    from benchmarks.convergence.defaults import defaults_spec

    spec = defaults_spec(regime=REGIMES["large"], lamb={"lr": 0.02, "warmup": 0.2}, seed=1, steps=10, part="tune",
                         extra={"grafting": "kfac-size"}, lamb_shape={"max_grad_norm": 0})
    assert spec.name == "defaults_graftingkfac-size_lamb_max_grad_norm0_seed1"
    cfg = spec.ds_config(REGIMES["large"])
    assert cfg["optimizer"]["params"]["max_grad_norm"] == 0 and cfg["kfac"] == {"enabled": True,
                                                                                "grafting": "kfac-size"}
    plain = defaults_spec(regime=REGIMES["large"], lamb={"lr": 0.02, "warmup": 0.2}, seed=1, steps=10, part="tune")
    assert "max_grad_norm" not in plain.ds_config(REGIMES["large"])["optimizer"]["params"]
    assert "lamb_shape" not in plain.key()  # records made before the option keep their key


def test_lamb_keys_under_kfac_are_refused_on_the_report_part_by_name(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--lamb-set.*--part tune"):
        main(["defaults", "--regime", "small", "--lamb-set", "max_grad_norm=0", "--results", str(tmp_path)])
