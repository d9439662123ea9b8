"""benchmarks.refresh_accuracy at toy scale: on real text, the refresh is compared with FP64 eigh at every
decomposition."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import refresh_accuracy
from tests.support.bert_data import BERT_VOCAB, SHARED_ABSENT, WIKITEXT_VALID, real_data_present

pytestmark = pytest.mark.skipif(not real_data_present(), reason=SHARED_ABSENT)
TEXT = ["--text", str(WIKITEXT_VALID), "--vocab", str(BERT_VOCAB)]


@pytest.mark.slow  # ~30 s; default suite: the next test runs the same comparison
def test_the_refresh_is_compared_with_fp64_eigh_at_every_decomposition(tmp_path: Path) -> None:
    res = refresh_accuracy.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--steps", "120", "--windows", "4",
                                 "--chains", "0:0.2", "0:0", *TEXT, "--out", str(tmp_path / "r.json")])
    rows = {r["chain"]: r for r in res["rows"]}
    assert rows["0:0"]["min_cosine"] > 0.9999  # every factor decomposed exactly: the reference itself (FP32/FP64)
    assert rows["0:0.2"]["layer_decompositions"] == rows["0:0"]["layer_decompositions"] > 0
    assert rows["stale"]["median_cosine"] < rows["0:0"]["median_cosine"]


def test_a_second_run_in_one_process_reports_only_its_own_worst_layers(tmp_path: Path) -> None:
    """The worst layers were kept in a module-level dict: a second run's record listed the first run's chains."""
    args = ["--size", "tiny", "--batch", "2", "--seq", "8", "--steps", "51", "--windows", "2", *TEXT]
    refresh_accuracy.main([*args, "--chains", "0:0", "--out", str(tmp_path / "a.json")])
    res = refresh_accuracy.main([*args, "--chains", "0:0.2", "--out", str(tmp_path / "b.json")])
    assert set(res["worst"]) == {"0:0.2", "stale"}
