"""mission: the report reads each stage's outputs into one table and plots both variants' loss curves."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from kaisa_ds.report.metrics_log import read_rows
from mission.report import write_report
from mission.run import parse_args


def _fake_run(root: Path, *, loss: float, f1: float, before: float,
              heldout: list[float] | None = None, seconds_per_step: float = 2.0,
              kfac: tuple[bool | None, bool | None] | None = None) -> None:
    """A finished variant's folders; phase 1 evaluates its held-out MLM loss every 2 of its 4 steps. ``kfac``:
    what each phase's summary records (default: K-FAC in both phases of the "kfac" folder only)."""
    kfac = kfac or ((root.name == "kfac",) * 2)
    for (phase, steps), used in zip((("phase1", 4), ("phase2", 2)), kfac):
        (root / phase).mkdir(parents=True)
        rows = [{"step": s, "loss": loss + (steps - s), "elapsed_s": seconds_per_step * s} for s in range(1, steps + 1)]
        if phase == "phase1":
            for row, value in zip(rows[1::2], heldout or [loss + 1, loss]):
                row["heldout_mlm_loss"] = value
        (root / phase / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"steps": steps, "final_train_loss": loss, "heldout_mlm_accuracy": 0.25, "heldout_mlm_loss": loss}
        (root / phase / "summary.json").write_text(json.dumps(summary | ({} if used is None else {"kfac": used})))
    (root / "squad").mkdir()
    (root / "squad" / "eval_results.json").write_text(json.dumps({"exact_match": f1 - 10, "f1": f1}))
    (root / "squad" / "metrics.jsonl").write_text(json.dumps({"event": "eval", "step": 0, "f1": before}) + "\n")


def test_report_has_one_row_per_variant_with_its_own_figures(tmp_path: Path) -> None:
    runs = {"LAMB": tmp_path / "lamb", "LAMB + K-FAC": tmp_path / "kfac"}
    _fake_run(runs["LAMB"], loss=3.5, f1=40.0, before=7.0)
    _fake_run(runs["LAMB + K-FAC"], loss=3.25, f1=55.5, before=6.5)
    seconds = {"LAMB": {"phase1": 60.0, "phase2": 30.0, "squad": 100.0},
               "LAMB + K-FAC": {"phase1": 70.0, "phase2": 35.0, "squad": 101.0}}
    report = write_report(tmp_path, runs, seconds, {"model": "tiny"})
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in report.read_text().splitlines() if line.startswith("| LAMB")}
    assert rows["LAMB"] == ["4", "2", "90", "3.5000", "3.5000", "0.2500", "30.00", "40.00", "7.00", "3.5000", "4.0",
                            "8.0"]
    # K-FAC's held-out curve: 4.25 at step 2, 3.25 at step 4: LAMB's final 3.5 is crossed 3/4 of the way
    assert rows["LAMB + K-FAC"] == ["4", "2", "105", "3.2500", "3.2500", "0.2500", "45.50", "55.50", "6.50",
                                    "3.2500", "3.5", "7.0"]
    assert (tmp_path / "loss_curves.png").stat().st_size > 10_000
    assert (tmp_path / "heldout_curves.png").stat().st_size > 10_000


def test_missing_stage_outputs_show_as_not_available(tmp_path: Path) -> None:
    report = write_report(tmp_path, {"LAMB": tmp_path / "absent"}, {"LAMB": {}}, {})
    row = next(line for line in report.read_text().splitlines() if line.startswith("| LAMB"))
    assert row.count("n/a") == 11


def _report_json(tmp_path: Path, *, kfac_heldout: list[float]) -> dict:
    runs = {"LAMB": tmp_path / "lamb", "LAMB + K-FAC": tmp_path / "kfac"}
    _fake_run(runs["LAMB"], loss=3.5, f1=40.0, before=7.0, heldout=[5.0, 3.5])
    _fake_run(runs["LAMB + K-FAC"], loss=3.25, f1=55.5, before=6.5, heldout=kfac_heldout, seconds_per_step=3.0)
    seconds = {"LAMB": {"phase1": 60.0, "phase2": 30.0}, "LAMB + K-FAC": {"phase1": 70.0, "phase2": 35.0}}
    write_report(tmp_path, runs, seconds, {"model": "tiny"})
    return json.loads((tmp_path / "report.json").read_text())


def test_report_json_interpolates_the_crossing_of_lambs_final_loss(tmp_path: Path) -> None:
    data = _report_json(tmp_path, kfac_heldout=[4.0, 3.0])
    assert set(data["variants"]) == {"lamb", "kfac"}
    lamb, kfac = data["variants"]["lamb"], data["variants"]["kfac"]
    assert data["target"]["final_heldout_mlm"] == 3.5 and lamb["final_heldout_mlm"] == 3.5
    assert lamb["steps_to_lamb_final"] == 4 and lamb["seconds_to_lamb_final"] == 8.0
    # 4.0 at step 2 (6 s), 3.0 at step 4 (12 s): 3.5 is halfway
    assert kfac["steps_to_lamb_final"] == pytest.approx(3.0) and kfac["seconds_to_lamb_final"] == pytest.approx(9.0)
    assert kfac["pretrain_seconds"] == 105.0 and kfac["squad_f1"] == 55.5 and kfac["final_heldout_mlm"] == 3.0
    assert kfac["pretrain_train_seconds"] == pytest.approx(12.0 + 6.0)  # phase-1 and phase-2 elapsed_s


def test_report_json_has_null_when_lambs_final_is_never_reached(tmp_path: Path) -> None:
    kfac = _report_json(tmp_path, kfac_heldout=[4.0, 3.6])["variants"]["kfac"]
    assert kfac["steps_to_lamb_final"] is None and kfac["seconds_to_lamb_final"] is None
    assert "| LAMB + K-FAC |" in (tmp_path / "report.md").read_text()


def test_report_tolerates_a_torn_last_metrics_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runs = {"LAMB": tmp_path / "lamb"}
    _fake_run(runs["LAMB"], loss=3.5, f1=40.0, before=7.0)
    metrics = runs["LAMB"] / "phase1" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 5, "loss": 3.')  # killed mid-write
    with caplog.at_level(logging.WARNING):
        assert [r["step"] for r in read_rows(metrics)] == [1, 2, 3, 4]
        write_report(tmp_path, runs, {"LAMB": {}}, {})
    assert "torn last line" in caplog.text
    assert json.loads((tmp_path / "report.json").read_text())["variants"]["lamb"]["final_heldout_mlm"] == 3.5


def _rows(report: Path) -> dict[str, list[str]]:
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in report.read_text().splitlines() if line.startswith("| LAMB")}


@pytest.mark.parametrize(("recorded", "label"), [
    ((False, False), "LAMB; requested as LAMB + K-FAC"),  # LAMB configs given to the K-FAC variant
    ((False, True), "LAMB + K-FAC (phase 2 only); requested as LAMB + K-FAC"),
    ((True, False), "LAMB + K-FAC (phase 1 only); requested as LAMB + K-FAC"),
    ((None, None), "LAMB + K-FAC (K-FAC use not recorded)"),
])
def test_row_labels_come_from_what_each_phase_recorded(tmp_path: Path, recorded: tuple, label: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The K-FAC variant's label once was the variant's name, whatever its configs did."""
    runs = {"LAMB": tmp_path / "lamb", "LAMB + K-FAC": tmp_path / "kfac"}
    _fake_run(runs["LAMB"], loss=3.5, f1=40.0, before=7.0)
    _fake_run(runs["LAMB + K-FAC"], loss=3.25, f1=55.5, before=6.5, kfac=recorded)
    with caplog.at_level(logging.WARNING):
        report = write_report(tmp_path, runs, {}, {"model": "tiny"})
    assert list(_rows(report)) == ["LAMB", label]
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["variants"]["kfac"]["label"] == label
    assert data["variants"]["kfac"]["kfac"] == {"phase1": recorded[0], "phase2": recorded[1]}
    assert any("LAMB + K-FAC" in w and label in w for w in data["warnings"])
    assert label in caplog.text


def test_defaults_fit_the_cpu_budget_and_flags_parse(tmp_path: Path) -> None:
    args = parse_args([])
    assert (args.model_size, args.ranks, args.squad_epochs) == ("tiny", 2, 4)
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("text\n")
    args = parse_args(["--model-size", "mini", "--phase1-steps", "7", "--data", str(tmp_path / "a.txt"),
                       str(tmp_path / "b.txt")])
    assert args.phase1_steps == 7 and [p.name for p in args.data] == ["a.txt", "b.txt"]


WIKITEXT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "wikitext-2" / "valid.txt"
BERT_VOCAB = WIKITEXT.parents[1] / "bert-vocab" / "vocab.txt"


@pytest.mark.slow
@pytest.mark.skipif(not (WIKITEXT.is_file() and BERT_VOCAB.is_file()), reason="../shared/data absent")
def test_main_job_end_to_end_short_learns_real_text_with_the_given_vocabulary(tmp_path: Path) -> None:
    """The README's main command, short, on real text (the first 400 kB of WikiText-2 valid) with BERT's
    vocabulary: every stage runs, the models have BERT's 30,522 tokens, under 5% of the text is [UNK], and each
    variant's held-out MLM loss falls by at least 0.25 nats from its first evaluation (step 4) to its last (16).
    Measured (2 shared CPU cores): LAMB 10.09 -> 9.69, LAMB + K-FAC 9.84 -> 8.51 (ln 30522 = 10.33)."""
    from bert_pretrain.data.documents import WIKITEXT_MARKS
    from bert_pretrain.data.tokenizer import count_unknown, load_tokenizer, vocab_digest
    from mission.run import main

    text = tmp_path / "wikitext_head.txt"
    text.write_bytes(WIKITEXT.read_bytes()[:400_000])
    out = tmp_path / "out"
    assert main(["--output", str(out), "--data", str(text), "--vocab", str(BERT_VOCAB), "--phase1-steps", "16",
                 "--phase2-steps", "2", "--squad-epochs", "1", "--eval-every", "4", "--kfac-full-run"]) == 0
    report = (out / "report.md").read_text()
    assert "| LAMB |" in report and "| LAMB + K-FAC |" in report, report  # labels as the phases recorded them
    assert "not in the pretraining text" in report  # --data fine-tuned on the built-in questions: said
    for variant in ("lamb", "kfac"):
        final = out / variant / "phase2" / "final"
        assert json.loads((final / "config.json").read_text())["vocab_size"] == 30522
        assert vocab_digest(final / "vocab.txt") == vocab_digest(BERT_VOCAB)
        heldout = [r["heldout_mlm_loss"] for r in read_rows(out / variant / "phase1" / "metrics.jsonl")
                   if "heldout_mlm_loss" in r]
        assert len(heldout) == 4 and heldout[0] - heldout[-1] >= 0.25, (variant, heldout)
    tok = load_tokenizer(out / "lamb" / "phase2" / "final" / "vocab.txt")
    lines = [WIKITEXT_MARKS.sub(r"\1", line) for line in text.read_text().splitlines() if line.strip()]
    unknown, total = count_unknown(tok, lines)
    assert total > 50_000 and unknown / total < 0.05, (unknown, total)
    variants = json.loads((out / "report.json").read_text())["variants"]
    assert variants["lamb"]["steps_to_lamb_final"] is not None and variants["kfac"]["squad_f1"] is not None
    print(report, file=sys.stderr)


def test_a_lamb_whose_loss_rose_late_is_also_measured_against_its_best(tmp_path: Path) -> None:
    """Time to LAMB's final rewards a LAMB whose held-out loss rises late; the report also gives the time to its
    best, in report.json and in the headline, and says when K-FAC never reached it."""
    runs = {"LAMB": tmp_path / "lamb", "LAMB + K-FAC": tmp_path / "kfac"}
    _fake_run(runs["LAMB"], loss=3.5, f1=40.0, before=7.0, heldout=[3.2, 3.5])  # best 3.2 at step 2, final 3.5
    _fake_run(runs["LAMB + K-FAC"], loss=3.25, f1=55.5, before=6.5, heldout=[4.0, 3.0])
    write_report(tmp_path, runs, {"LAMB": {}, "LAMB + K-FAC": {}}, {"model": "tiny"})
    data = json.loads((tmp_path / "report.json").read_text())
    kfac = data["variants"]["kfac"]
    assert data["target"]["best_heldout_mlm"] == 3.2
    # 4.0 at step 2 (4 s), 3.0 at step 4 (8 s): 3.5 at step 3, 3.2 at step 3.6; LAMB's phase 1 is 8 s and 4 steps,
    # and LAMB reached its best at step 2 (4 s): time to its best counts against that, not against its whole run
    assert kfac["time_ratio_to_lamb_final"] == pytest.approx(0.75)
    assert kfac["steps_to_lamb_best"] == pytest.approx(3.6) and kfac["time_ratio_to_lamb_best"] == pytest.approx(1.8)
    assert kfac["step_ratio_to_lamb_best"] == pytest.approx(1.8)
    report = (tmp_path / "report.md").read_text()
    assert "rose after its best (3.2000)" in report
    assert "its best in 1.80× the training time LAMB needed to reach it" in report
    other = tmp_path / "other"
    _fake_run(other / "kfac", loss=3.4, f1=50.0, before=6.0, heldout=[4.0, 3.4])  # reaches 3.5, never 3.2
    write_report(other, {"LAMB": runs["LAMB"], "LAMB + K-FAC": other / "kfac"}, {}, {"model": "tiny"})
    assert "**LAMB + K-FAC never reached its best.**" in (other / "report.md").read_text()


def test_report_names_its_seed(tmp_path: Path) -> None:
    """A report once said "one seed" without saying which, so reports of several seeds could not be told apart."""
    runs = {"LAMB": tmp_path / "lamb"}
    _fake_run(runs["LAMB"], loss=3.5, f1=40.0, before=7.0)
    report = write_report(tmp_path, runs, {"LAMB": {}}, {"model": "tiny", "seed": 7})
    assert "seed 7" in report.read_text()
    assert json.loads((tmp_path / "report.json").read_text())["settings"]["seed"] == 7


def test_report_settings_carry_the_seed() -> None:
    from mission.run import report_settings

    assert report_settings(parse_args(["--seed", "3"]), squad="t / e")["seed"] == 3


def test_report_names_the_decomposition_interval_each_k_fac_phase_timed(tmp_path: Path) -> None:
    """Two runs of one seed took different steps when the "auto" interval was timed differently (15 vs 20):
    the report says which interval its K-FAC run used, and how to pin it."""
    runs = {"LAMB": tmp_path / "lamb", "LAMB + K-FAC": tmp_path / "kfac"}
    _fake_run(runs["LAMB"], loss=3.5, f1=40.0, before=7.0)
    _fake_run(runs["LAMB + K-FAC"], loss=3.25, f1=55.5, before=6.5)
    metrics = runs["LAMB + K-FAC"] / "phase1" / "metrics.jsonl"
    rows = read_rows(metrics)
    for row, interval in zip(rows, (10, 10, 15, 15)):
        row["kfac"] = {"inv_update_steps": interval, "cost_interval": None if interval == 10 else interval}
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(tmp_path, runs, {}, {"model": "tiny"}).read_text()
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["variants"]["kfac"]["phase1_decomposition_intervals"] == [[1, 10], [3, 15]]
    assert data["variants"]["lamb"]["phase1_decomposition_intervals"] == []
    line = next(x for x in report.splitlines() if "decompositions:" in x)
    assert line.startswith("LAMB + K-FAC's") and "every 10 steps from step 1, every 15 steps from step 3" in line
    assert "inv_update_steps" in line and report.count("decompositions:") == 1
