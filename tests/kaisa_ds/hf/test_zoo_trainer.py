"""A grouped-query-attention decoder (Llama) and an encoder (BERT) from the model zoo through the HF Trainer +
DeepSpeed (ZeRO-1) on 2 CPU ranks, with ``"kfac": {"enabled": true}`` alone: K-FAC steps every optimizer step,
covers >= 80% of the linear-like parameters, and the loss falls on WikiText-2 blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kaisa_ds.hf import zoo_trainer_worker
from tests.support.bert_data import SHARED_ABSENT, real_data_present
from tests.support.launch import run_deepspeed

WORKER = str(Path(zoo_trainer_worker.__file__))


# slow: the default suite runs the same path in the two example tests (test_example_causal_lm: a GQA Llama through
# the Trainer and DeepSpeed ZeRO-1 on 2 ranks; test_examples: BERT); this one adds the coverage figure for both
@pytest.mark.slow
@pytest.mark.skipif(not real_data_present(), reason=SHARED_ABSENT)
def test_gqa_decoder_and_encoder_train_with_kfac_through_the_trainer_and_deepspeed(tmp_path: Path) -> None:
    out = tmp_path / "zoo.json"
    run_deepspeed([WORKER, str(out), "llama", "bert"])
    results = json.loads(out.read_text())
    for family, got in results.items():
        assert got["zero_stage"] == 1 and got["kfac_steps"] == zoo_trainer_worker.STEPS, (family, got)
        assert got["coverage"]["linear_share"] >= 0.8, (family, got["coverage"])
        losses = got["losses"]
        assert len(losses) == zoo_trainer_worker.STEPS
        assert sum(losses[:3]) / 3 - sum(losses[-3:]) / 3 >= 0.5, (family, losses)
