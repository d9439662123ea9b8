"""``--eval-data`` sets are read and checked as ``--data`` is: with ``--encoding`` and under ``--max-unk-rate``
(both were dropped for them, issue 21 item 15), and a refusal names the set."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from bert_pretrain import eval_sets
from bert_pretrain.cli import build_parser
from bert_pretrain.data.documents import DataError
from tests.support.bert_data import BERT_VOCAB, SHARED_ABSENT, real_data_present, wikitext_excerpt

pytestmark = pytest.mark.skipif(not real_data_present(), reason=SHARED_ABSENT)


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group: prepare_on_rank0 broadcasts rank 0's outcome."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _prepare(tmp: Path, *flags: str) -> dict[str, Any]:
    cache = tmp / "data"
    cache.mkdir()
    shutil.copyfile(BERT_VOCAB, cache / "vocab.txt")  # the training vocabulary, as the training data left it
    args = build_parser().parse_args(["--phase", "1", "--config", "unused.json", "--output", str(tmp / "run"),
                                      "--max-seq-length", "64", *flags])
    return eval_sets.prepare_on_rank0(args, cache, rank=0)


def test_a_latin1_eval_set_is_read_with_encoding(tmp_path: Path, one_rank: None) -> None:
    text = wikitext_excerpt(tmp_path / "latin.txt", encoding="latin-1", accented=True)
    sets = _prepare(tmp_path, "--encoding", "latin-1", "--eval-data", f"latin={text}")
    assert len(sets["latin"]) > 100


def test_an_eval_set_over_the_unk_limit_is_refused_by_name(tmp_path: Path, one_rank: None) -> None:
    """About 10% of this text is [UNK] with the BERT vocabulary: under the default 20%, over --max-unk-rate 0.05."""
    text = wikitext_excerpt(tmp_path / "odd.txt", foreign_every=8)
    with pytest.raises(DataError, match=r"--eval-data odd=.*odd.txt: .*\[UNK\].*--max-unk-rate 0.05"):
        _prepare(tmp_path, "--max-unk-rate", "0.05", "--eval-data", f"odd={text}")
