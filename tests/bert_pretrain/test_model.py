"""The model: named sizes, local folders, the gathered MLM loss against HF's own full-sequence loss, and the
position and vocabulary checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bert_pretrain.data.documents import DataError
from bert_pretrain.data.examples import IGNORE
from bert_pretrain.evaluation import evaluate
from bert_pretrain.model import STATS, MaskedLMLoss, PretrainingLoss, build_model, check_positions


def _batch(vocab: int, *, seq: int = 24, preds: int = 5, n: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (n, seq), generator=g)
    positions = torch.stack([torch.randperm(seq - 2, generator=g)[:preds].sort().values + 1 for _ in range(n)])
    labels = torch.gather(ids, 1, positions)
    labels[0, 3:] = IGNORE  # a sequence with fewer predictions (padded slots)
    positions[0, 3:] = 0
    attention = torch.ones(n, seq, dtype=torch.long)
    attention[1, -4:] = 0
    return {"input_ids": ids, "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(n, -1),
            "attention_mask": attention, "masked_lm_positions": positions, "masked_lm_ids": labels,
            "next_sentence_label": torch.tensor([0, 1, 1, 0])}


def test_gathered_loss_equals_hf_full_sequence_loss() -> None:
    torch.manual_seed(0)
    bert = build_model("tiny", vocab_size=300).eval()
    batch = _batch(300)
    full_labels = torch.full_like(batch["input_ids"], IGNORE)
    valid = batch["masked_lm_ids"] != IGNORE
    rows = torch.arange(4).unsqueeze(1).expand_as(valid)
    full_labels[rows[valid], batch["masked_lm_positions"][valid]] = batch["masked_lm_ids"][valid]
    with torch.no_grad():
        reference = bert(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                         attention_mask=batch["attention_mask"], labels=full_labels,
                         next_sentence_label=batch["next_sentence_label"])
        module = PretrainingLoss(bert)
        loss = module(batch)
    assert torch.allclose(loss, reference.loss, atol=1e-5)
    assert module.last is not None
    stats = dict(zip(STATS, module.last.tolist()))
    assert stats["mlm_count"] == int(valid.sum()) and stats["nsp_count"] == 4
    assert stats["loss"] == pytest.approx(stats["mlm_loss"] + stats["nsp_loss"], abs=1e-5)
    mlm_logits = reference.prediction_logits[rows[valid], batch["masked_lm_positions"][valid]]
    assert stats["mlm_correct"] == int((mlm_logits.argmax(-1) == batch["masked_lm_ids"][valid]).sum())


def test_mlm_only_model_is_the_pretraining_model_without_nsp() -> None:
    """build_model(mlm_only=True) + MaskedLMLoss (the minimal loop's model) computes the pipeline's MLM loss with the
    same weights, and has no pooler or NSP head for K-FAC to precondition."""
    torch.manual_seed(0)
    full = build_model("tiny", vocab_size=300).eval()
    mlm_only = build_model("tiny", vocab_size=300, mlm_only=True).eval()
    mlm_only.load_state_dict(full.state_dict(), strict=False)
    names = {n for n, _ in mlm_only.named_modules()}
    assert not any("pooler" in n or "seq_relationship" in n for n in names)
    batch = _batch(300)
    with torch.no_grad():
        both, alone = PretrainingLoss(full), MaskedLMLoss(mlm_only)
        both(batch)
        loss = alone(batch)
    assert both.last is not None and alone.last is not None
    ours, theirs = dict(zip(STATS, alone.last.tolist())), dict(zip(STATS, both.last.tolist()))
    assert loss.item() == pytest.approx(theirs["mlm_loss"], abs=1e-6) and ours["loss"] == ours["mlm_loss"]
    assert (ours["mlm_correct"], ours["mlm_count"]) == (theirs["mlm_correct"], theirs["mlm_count"])
    assert ours["nsp_count"] == ours["nsp_loss"] == 0


def test_single_process_evaluation_sums_every_example_and_reports_nsp_only_with_it() -> None:
    torch.manual_seed(0)
    module = MaskedLMLoss(build_model("tiny", vocab_size=300, mlm_only=True))
    batch = _batch(300)
    held = [{k: v[i:i + 1] for k, v in batch.items()} for i in range(4)]

    class Rows:  # a prepared split's slicing: rows[list] -> one batch
        def __len__(self) -> int:
            return 4

        def __getitem__(self, idx: list[int]) -> dict[str, torch.Tensor]:
            return {k: torch.cat([held[i][k] for i in idx]) for k in batch}

    metrics = evaluate(module, Rows(), device=torch.device("cpu"), examples=4, micro_batch=3)
    with torch.no_grad():
        whole = module.eval()(batch).item()
    assert metrics["heldout_mlm_loss"] == pytest.approx(whole, rel=1e-5)  # token-weighted over uneven batches
    assert "heldout_nsp_loss" not in metrics
    assert "heldout_mlm_baseline_accuracy" not in metrics  # no baseline token given: no figure (not padding counts)
    with_nsp = evaluate(PretrainingLoss(build_model("tiny", vocab_size=300)), Rows(), device=torch.device("cpu"),
                        examples=4, micro_batch=3)
    assert 0 <= with_nsp["heldout_nsp_accuracy"] <= 1


def test_gradients_reach_the_tied_decoder_and_nsp_head() -> None:
    torch.manual_seed(0)
    module = PretrainingLoss(build_model("tiny", vocab_size=300))
    module(_batch(300)).backward()
    bert = module.bert_model
    assert bert.cls.predictions.decoder.weight is bert.bert.embeddings.word_embeddings.weight
    assert bert.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert bert.cls.seq_relationship.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(("size", "hidden", "layers"), [("tiny", 128, 2), ("mini", 256, 4)])
def test_named_sizes(size: str, hidden: int, layers: int) -> None:
    config = build_model(size, vocab_size=100).config
    assert (config.hidden_size, config.num_hidden_layers, config.max_position_embeddings) == (hidden, layers, 512)
    with pytest.raises(DataError, match="--model-size huge"):
        build_model("huge", vocab_size=100)


def test_local_folder_round_trip_and_checks(tmp_path: Path) -> None:
    torch.manual_seed(0)
    saved = build_model("tiny", vocab_size=120, max_positions=128)
    saved.save_pretrained(tmp_path / "m")
    loaded = build_model(tmp_path / "m", vocab_size=120)
    assert loaded.training  # ready to train: dropout on, K-FAC hooks capture
    assert torch.equal(loaded.bert.embeddings.word_embeddings.weight, saved.bert.embeddings.word_embeddings.weight)
    with pytest.raises(DataError, match="vocabulary of 120 tokens but the data uses 121"):
        build_model(tmp_path / "m", vocab_size=121)
    with pytest.raises(DataError, match="not a model folder"):
        build_model(tmp_path, vocab_size=120)
    check_positions(loaded, 128, source="m")
    with pytest.raises(DataError, match="sequences of 512 tokens do not fit m, which has 128 positions"):
        check_positions(loaded, 512, source="m")
