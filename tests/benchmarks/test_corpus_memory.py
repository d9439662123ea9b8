"""benchmarks.corpus_memory: the peak memory of data preparation does not grow with the corpus (issue 12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import corpus_memory
from benchmarks.harness.memory import MB


def test_generated_text_has_the_size_asked_for(tmp_path: Path) -> None:
    path = corpus_memory.generate_text(tmp_path / "c.txt", megabytes=1.5)
    assert path.stat().st_size == int(1.5 * MB)
    assert path.read_text().count("\n\n") > 1000  # blank-line-separated documents


@pytest.mark.slow
def test_smoke_two_sizes_are_measured_side_by_side(tmp_path: Path) -> None:
    res = corpus_memory.run([1, 2], workdir=tmp_path)
    small, large = res["rows"]
    assert large["examples"] > 1.5 * small["examples"] > 0
    assert 0 < small["peak_anon_mb"] <= small["peak_pss_mb"]
    assert set(res["growth_per_input_mb"]) == {"peak_pss_mb", "peak_anon_mb", "peak_file_mb", "main_peak_rss_mb"}
    assert not list(tmp_path.iterdir())  # generated text and prepared data removed


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 20 + 200 MB of preparation: 6-8 min on a quiet 2-core machine, over 10 on a busy one
def test_anonymous_memory_does_not_grow_with_the_corpus(tmp_path: Path) -> None:
    """Between 20 and 200 MB of text, the peak anonymous memory of preparation (main process and map workers)
    grows by far less than the text: less than a tenth of a MB per MB (a reader holding the corpus, its
    documents or their token ids would grow by one or more MB per MB)."""
    res = corpus_memory.run([20, 200], workdir=tmp_path)
    growth = res["growth_per_input_mb"]["peak_anon_mb"]
    assert growth < 0.1, res["rows"]
