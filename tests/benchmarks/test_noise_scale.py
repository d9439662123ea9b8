"""benchmarks.noise_scale at toy scale: it runs end to end on real text, and its figures are the ones it claims
to be."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import noise_scale
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
