"""Eval-only on the real SQuAD v1.1 dev subset with an untrained tiny model and the real vocab: the pipeline runs
end to end at BERT's window sizes and the metric covers exactly the selected questions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from squad_finetune.evaluate import score_predictions
from tests.support.squad_data import BERT_VOCAB, DEV_SUBSET, REPO_ROOT, requires_bert_vocab, requires_dev_subset


@requires_dev_subset
@requires_bert_vocab
@pytest.mark.slow  # ~16 s
def test_eval_only_on_dev_articles(tmp_path: Path) -> None:
    from bert_pretrain.data.tokenizer import load_tokenizer
    from tests.support.squad_data import save_tiny_qa_model

    tokenizer = load_tokenizer(BERT_VOCAB)
    assert len(tokenizer) == 30522
    model = save_tiny_qa_model(tmp_path / "untrained", tokenizer, hidden=32, layers=1, heads=2, max_positions=512)
    output = tmp_path / "eval"
    proc = subprocess.run(
        [sys.executable, "-m", "squad_finetune", "--eval-only", "--model", str(model), "--eval-file", str(DEV_SUBSET),
         "--max-eval-articles", "2", "--max-seq-length", "384", "--doc-stride", "128", "--max-query-length", "64",
         "--output", str(output)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    data = json.loads(DEV_SUBSET.read_text())["data"][:2]
    gold = {q["id"]: [a["text"] for a in q["answers"]] for a in data for p in a["paragraphs"] for q in p["qas"]}
    contexts = {q["id"]: p["context"] for a in data for p in a["paragraphs"] for q in p["qas"]}
    results = json.loads((output / "eval_results.json").read_text())
    predictions = json.loads((output / "predictions.json").read_text())
    assert results["questions"] == len(gold) > 500
    assert predictions.keys() == gold.keys()
    assert all(answer in contexts[qid] for qid, answer in predictions.items())
    rescored = score_predictions(gold, predictions)
    assert (results["exact_match"], results["f1"]) == (rescored.exact_match, rescored.f1)
    assert 0.0 <= results["f1"] < 20.0  # an untrained model answers (nearly) at random
    assert f"on {len(gold)} questions" in proc.stdout
