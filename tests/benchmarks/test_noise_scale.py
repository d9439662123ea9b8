"""Smoke tests of benchmarks.noise_scale, benchmarks.refresh_accuracy and benchmarks.default_overhead at toy scale:
each runs end to end on real text (or random tokens), and its figures are the ones it claims to be."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import default_overhead, noise_scale, refresh_accuracy
from tests.support.bert_data import BERT_VOCAB, SHARED_ABSENT, WIKITEXT_VALID, real_data_present

pytestmark = pytest.mark.skipif(not real_data_present(), reason=SHARED_ABSENT)
TEXT = ["--text", str(WIKITEXT_VALID), "--vocab", str(BERT_VOCAB)]


def test_the_noise_scale_is_printed_along_a_lamb_run_and_plotted(tmp_path: Path) -> None:
    out = tmp_path / "noise.json"
    res = noise_scale.main(["--steps", "12", "--every", "4", "--batch", "4", "--seq", "16", "--passes", "2",
                            "--smoothing", "0.5", *TEXT, "--out", str(out)])
    assert [r["step"] for r in res["rows"]] == [4, 8, 12]
    measured = [r for r in res["rows"] if r["b_simple_sequences"] is not None]
    assert measured and all(r["b_simple_tokens"] == pytest.approx(16 * r["b_simple_sequences"]) for r in measured)
    assert res["batch_tokens"] == 4 * 2 * 16 and out.with_suffix(".png").is_file()
    with pytest.raises(SystemExit):
        noise_scale.main(["--passes", "1", *TEXT, "--out", str(tmp_path / "x.json")])


def test_the_refresh_is_compared_with_fp64_eigh_at_every_decomposition(tmp_path: Path) -> None:
    res = refresh_accuracy.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--steps", "120", "--windows", "4",
                                 "--chains", "0:0.2", "0:0", *TEXT, "--out", str(tmp_path / "r.json")])
    rows = {r["chain"]: r for r in res["rows"]}
    assert rows["0:0"]["min_cosine"] > 0.9999  # every factor decomposed exactly: the reference itself (FP32/FP64)
    assert rows["0:0.2"]["layer_decompositions"] == rows["0:0"]["layer_decompositions"] > 0
    assert rows["stale"]["median_cosine"] < rows["0:0"]["median_cosine"]


def test_the_default_overhead_compares_two_copies_side_by_side(tmp_path: Path) -> None:
    res = default_overhead.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--steps", "10",
                                 "--warmup-limit", "55", "--out", str(tmp_path / "o.json")])  # rows rule: 50
    assert res["steady_steps"] == 10 and res["kfac_step_s"] > 0 and res["baseline_step_s"] > 0
    assert res["overhead"] == pytest.approx(res["kfac_step_s"] / res["baseline_step_s"] - 1)
    assert res["cost_interval"] is not None  # the steady state starts once the cost rule has set the interval
