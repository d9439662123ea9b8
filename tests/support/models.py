"""Tiny models used across the test suite."""

from __future__ import annotations

import torch
from torch import nn


class TinyMLP(nn.Module):
    """Two Linear layers (one without bias) on 2-D inputs."""

    def __init__(self, d_in: int = 6, d_hidden: int = 8, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(d_hidden, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TinyTransformerish(nn.Module):
    """Embedding → q/k/v projections sharing one input → output Linear on 3-D (batch, seq, dim) tensors."""

    def __init__(self, vocab: int = 11, dim: int = 6, n_out: int = 5) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, n_out)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        q, k, v = self.query(h), self.key(h), self.value(h)
        att = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return self.out(att @ v + h)


class TinyConvNet(nn.Module):
    """Conv2d (with padding and stride) → Linear classifier."""

    def __init__(self, c_in: int = 2, c_out: int = 3, n_out: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3, stride=2, padding=1)
        self.fc = nn.Linear(c_out * 4 * 4, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class TinyWithUnusedHead(nn.Module):
    """TinyTransformerish plus a head whose output never reaches the loss (BERT's pooler with NSP off):
    its forward hook fires but its weight gets no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.body = TinyTransformerish()
        self.head = nn.Linear(5, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.body(ids)
        self.head(out)  # computed, unused
        return out


def tiny_bert_mlm(*, vocab: int = 64, seed: int = 0) -> nn.Module:
    """A 2-layer, hidden-32 ``BertForMaskedLM`` without dropout (losses do not depend on the RNG stream)."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    return BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0))


def masked_lm_examples(count: int, *, vocab: int = 64, seq: int = 16, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Fixed-length MLM examples with every 4th position masked: every micro-batch has the same number of
    targets, so a token-count mean and a micro-batch mean are the same loss."""
    g = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(count):
        ids = torch.randint(5, vocab, (seq,), generator=g)
        labels = torch.full_like(ids, -100)
        labels[::4] = ids[::4]
        masked = ids.clone()
        masked[::4] = 4  # the [MASK] id of these tests
        examples.append({"input_ids": masked, "labels": labels})
    return examples


class TinyTwoEmbeddings(nn.Module):
    """Word + position embeddings of one width but different vocabularies (BERT's embeddings layer) → Linear."""

    def __init__(self, vocab: int = 11, positions: int = 4, dim: int = 6, n_out: int = 3) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(positions, dim)
        self.out = nn.Linear(dim, n_out)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        return self.out(self.word(ids) + self.position(positions))
