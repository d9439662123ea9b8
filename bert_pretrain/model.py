"""BERT for pretraining from a named size or a local model folder, and its MLM + NSP loss (or the MLM loss alone).

The model stays a standard HF ``BertForPreTraining`` (saved and loaded with save_pretrained/from_pretrained);
``PretrainingLoss`` wraps it for the engine and applies the vocabulary-wide MLM decoder only at the masked
positions, gathered with fixed shapes (``max_predictions`` per sequence): the same loss as decoding every
position, for a fraction of the cost, and no host synchronisation.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bert_pretrain.data.documents import DataError
from bert_pretrain.data.examples import IGNORE
from kaisa_ds.plan.bert_sizes import SIZES

logger = logging.getLogger(__name__)
STATS = ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct", "nsp_count")


def bert_config(size: str, *, vocab_size: int, max_positions: int = 512) -> Any:
    """HF ``BertConfig`` of a named size (``kaisa_ds.plan.bert_sizes.SIZES``: hidden, layers, heads, intermediate)."""
    from transformers import BertConfig

    hidden, layers, heads, inter = SIZES[size]
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=inter, max_position_embeddings=max_positions)


def build_model(size_or_dir: str | Path, *, vocab_size: int, max_positions: int = 512,
                flag: str = "--model-size/--init-checkpoint", mlm_only: bool = False) -> Any:
    """``BertForPreTraining`` (``BertForMaskedLM`` with ``mlm_only``: no pooler, no NSP head): from a saved folder
    (phase 2 from phase 1), or freshly initialised as BERT does."""
    from transformers import BertForMaskedLM, BertForPreTraining

    cls = BertForMaskedLM if mlm_only else BertForPreTraining
    path = Path(size_or_dir)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DataError(f"{flag}: {path} is not a model folder (no config.json); give a "
                            f"folder written by save_pretrained, or a size: {', '.join(SIZES)}")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        model = cls.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
        if model.config.vocab_size != vocab_size:
            raise DataError(f"{path} has a vocabulary of {model.config.vocab_size} tokens but the data uses "
                            f"{vocab_size}; prepare the data with that model's vocab.txt (--vocab {path}/vocab.txt)")
        return model.train()  # from_pretrained returns eval mode: no dropout, and K-FAC would capture nothing
    if str(size_or_dir) not in SIZES:
        raise DataError(f"--model-size {size_or_dir}: neither a model folder nor one of {', '.join(SIZES)}")
    return cls(bert_config(str(size_or_dir), vocab_size=vocab_size, max_positions=max_positions))


def check_positions(model: Any, seq_length: int, *, source: str) -> None:
    """Refuse sequences longer than the model's position embeddings (they would index out of range)."""
    positions = int(model.config.max_position_embeddings)
    if seq_length > positions:
        raise DataError(f"sequences of {seq_length} tokens do not fit {source}, which has {positions} positions; "
                        f"lower --max-seq-length to {positions} or use a model with more positions")


def masked_lm_loss(hidden: torch.Tensor, predictions: nn.Module,
                   batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BERT's MLM loss, the mean over the masked tokens: the decoder applied at the ``max_predictions`` gathered
    positions of each sequence only. Returns (loss, logits, flat targets; padding predictions hold ``IGNORE``)."""
    positions, targets = batch["masked_lm_positions"], batch["masked_lm_ids"]
    picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.size(-1)))
    logits = predictions(picked).float().flatten(0, 1)
    targets = targets.flatten()
    return F.cross_entropy(logits, targets, ignore_index=IGNORE), logits, targets


def batch_stats(*, loss: torch.Tensor, mlm: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor,
                nsp: torch.Tensor | None = None, nsp_logits: torch.Tensor | None = None,
                nsp_labels: torch.Tensor | None = None) -> torch.Tensor:
    """One batch's statistics in ``STATS`` order (detached, no host sync); without NSP its entries are 0."""
    with torch.no_grad():
        counted = targets != IGNORE
        zero = loss.new_zeros(())
        nsp_correct = zero if nsp_logits is None or nsp_labels is None else (
            (nsp_logits.argmax(-1) == nsp_labels).sum().float())
        nsp_count = zero if nsp_labels is None else loss.new_full((), float(nsp_labels.numel()))
        return torch.stack([loss.detach(), mlm.detach(), zero if nsp is None else nsp.detach(),
                            ((logits.argmax(-1) == targets) & counted).sum().float(), counted.sum().float(),
                            nsp_correct, nsp_count])


class PretrainingLoss(nn.Module):
    """``engine(batch)`` → MLM + NSP loss; ``last`` holds this batch's statistics as one tensor (see ``STATS``)."""

    def __init__(self, bert: Any) -> None:
        super().__init__()
        self.bert_model = bert
        self.last: torch.Tensor | None = None

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        bert, heads = self.bert_model.bert, self.bert_model.cls
        out = bert(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                   attention_mask=batch["attention_mask"])
        mlm, logits, targets = masked_lm_loss(out.last_hidden_state, heads.predictions, batch)
        nsp_logits = heads.seq_relationship(out.pooler_output).float()
        nsp_labels = batch["next_sentence_label"]
        nsp = F.cross_entropy(nsp_logits, nsp_labels)
        loss = mlm + nsp
        self.last = batch_stats(loss=loss, mlm=mlm, logits=logits, targets=targets, nsp=nsp, nsp_logits=nsp_logits,
                                nsp_labels=nsp_labels)
        return loss


class MaskedLMLoss(nn.Module):
    """``module(batch)`` → the MLM loss alone, of a ``build_model(..., mlm_only=True)`` model (no NSP head): loops
    without NSP. ``last`` as :class:`PretrainingLoss`'s, its NSP entries 0, so the same evaluation reads both."""

    def __init__(self, bert: Any) -> None:
        super().__init__()
        self.bert_model = bert
        self.last: torch.Tensor | None = None

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.bert_model.bert(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                                   attention_mask=batch["attention_mask"])
        mlm, logits, targets = masked_lm_loss(out.last_hidden_state, self.bert_model.cls.predictions, batch)
        self.last = batch_stats(loss=mlm, mlm=mlm, logits=logits, targets=targets)
        return mlm
