"""convergence minimal: the model, LAMB and KFACPreconditioner without DeepSpeed or NSP, on real text (issue 23, 2d)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.convergence import minimal
from benchmarks.convergence.cli import DATA, DEFAULT_VOCAB
from benchmarks.convergence.parts import write_parts
from benchmarks.convergence.regimes import QUICK_UNITS, REGIMES, quick
from benchmarks.convergence.runner import final_spec
from bert_pretrain.data.examples import IGNORE, Specials
from bert_pretrain.data.tokenizer import load_tokenizer

TEXT = DATA / "wikitext-2" / "valid.txt"
REAL_DATA = pytest.mark.skipif(not (TEXT.is_file() and DEFAULT_VOCAB.is_file()),
                               reason=f"real data absent: {TEXT} and {DEFAULT_VOCAB}")


@REAL_DATA
def test_blocks_are_the_text_in_order_and_each_use_is_masked_afresh(tmp_path: Path) -> None:
    tok = load_tokenizer(DEFAULT_VOCAB)
    text = tmp_path / "t.txt"
    text.write_text("the lobster is blue until it is cooked .\n\nit then turns red , as every cook knows .\n")
    blocks = minimal.token_blocks(text, tok, seq=8)
    pieces = tok(["the lobster is blue until it is cooked .", "it then turns red , as every cook knows ."],
                 add_special_tokens=False)["input_ids"]
    flat = [i for p in pieces for i in p]
    assert blocks.flatten().tolist() == flat[:blocks.numel()] and blocks.size(1) == 6
    sp = Specials.of(tok)
    batches = minimal.BlockBatches(blocks, micro_batch=blocks.size(0), max_predictions=2, specials=sp, seed=0)
    first, second = batches.next(), batches.next()  # one pass each: the same blocks, other masks
    assert batches.passes == 2.0
    assert (first["input_ids"][:, 0] == sp.cls).all() and (first["input_ids"][:, -1] == sp.sep).all()
    assert ((first["masked_lm_ids"] != IGNORE).sum(1) == 1).all()  # 15% of 8 tokens → 1 prediction
    assert not torch.equal(first["masked_lm_positions"], second["masked_lm_positions"])


@REAL_DATA
def test_the_minimal_loop_learns_real_text_with_and_without_kfac_and_reuses_its_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both optimizers lower the held-out and training MLM loss on WikiText within 10 steps (from ~ln 30522 ≈
    10.3), K-FAC is attached to the model's layers with the library's defaults, and a second call reuses the
    records."""
    regime = dataclasses.replace(quick(REGIMES["small"]), steps=10, eval_every=5, eval_examples=16, micro_batch=4)
    parts = write_parts([TEXT], tmp_path / "parts", max_units=QUICK_UNITS)
    chosen = {"lamb": {"lr": 0.02, "warmup": 0.1}}
    out = tmp_path / "results"
    result = minimal.minimal(regime=regime, parts=parts, chosen=chosen, seeds=[1], vocab=DEFAULT_VOCAB,
                             work=tmp_path / "work", out=out, info={})
    lamb = json.loads((out / "minimal" / "lamb_seed1.json").read_text())
    kfac = json.loads((out / "minimal" / "defaults_seed1.json").read_text())
    for record in (lamb, kfac):
        first, last = record["curve"]["values"][0], record["final"]
        assert last < first < 10.2, record["curve"]  # learning, and already below the uniform guess at step 5
        train = record["train_curve"]["values"]
        assert train[-1] < train[0], train
    assert lamb["kfac_layers"] == 0 and kfac["kfac_layers"] >= 8  # 2 layers × (q, k, v, out, in, out) + heads
    assert kfac["spec"]["optimizer"] == "kfac-defaults" and kfac["inputs"]["ds_config"]["kfac"] == {"enabled": True}
    assert kfac["final"] != lamb["final"]
    assert [r["seed"] for r in result["rows"]] == [1] and (out / "minimal.png").stat().st_size > 0

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a recorded run was trained again")

    monkeypatch.setattr(minimal, "train", refuse)
    again = minimal.minimal(regime=regime, parts=parts, chosen=chosen, seeds=[1], vocab=DEFAULT_VOCAB,
                            work=tmp_path / "work", out=out, info={})
    assert again["rows"] == result["rows"]
    other = final_spec(regime=regime, chosen={"lamb": {"lr": 0.03, "warmup": 0.1}}, optimizer="lamb", seed=1)
    with pytest.raises(AssertionError, match="trained again"):
        minimal.run_minimal(other, regime, parts, vocab=DEFAULT_VOCAB, work=tmp_path / "work",
                            record=out / "minimal" / "lamb_seed1.json", machine={})


@REAL_DATA
def test_the_pipelines_own_examples_come_as_one_rank_draws_them_sentence_pairs_with_their_fixed_masks(
        tmp_path: Path) -> None:
    """--examples pipeline bisects the minimal loop against the pipeline: bert_pretrain's prepared examples (both
    segments, dupe_factor fixed maskings), a pass counted per masking of the text."""
    regime = dataclasses.replace(quick(REGIMES["small"]), dupe_factor=2, micro_batch=4)
    parts = write_parts([TEXT], tmp_path / "parts", max_units=QUICK_UNITS)
    batches = minimal.PreparedBatches(regime, parts, vocab=DEFAULT_VOCAB, cache=tmp_path / "cache", seed=1)
    seen = [batches.next() for _ in range(3)]
    assert all(b["input_ids"].size(0) == 4 and b["input_ids"].size(1) <= regime.seq for b in seen)
    assert any((b["token_type_ids"] == 1).any() for b in seen)  # second segments, as the pipeline trains on
    assert all(((b["masked_lm_ids"] != IGNORE).sum(1) >= 1).all() for b in seen)
    assert batches.passes == pytest.approx(12 / (len(batches.examples) / 2))
