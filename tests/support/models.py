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


class TinyStack(nn.Module):
    """``depth`` equal Linear layers (tanh between): factors of equal size, so work splits evenly over ranks."""

    def __init__(self, width: int = 48, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)  # type: ignore[no-any-return]


class TinyGQA(nn.Module):
    """Grouped-query attention (Llama's q/k/v): the key and value projections are narrower than the query's and all
    three read one input, so they share an A factor while their G factors differ in size; then an MLP reading the
    same normalised input in parallel (GPT-J, Falcon, Phi), wider still."""

    def __init__(self, vocab: int = 11, dim: int = 8, kv: int = 4, ffn: int = 12, n_out: int = 5) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv, bias=False)
        self.v_proj = nn.Linear(dim, kv, bias=False)
        self.fc_in = nn.Linear(dim, ffn, bias=False)
        self.o_proj = nn.Linear(kv, dim)
        self.fc_out = nn.Linear(ffn, dim)
        self.head = nn.Linear(dim, n_out)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        heads = q.shape[-1] // k.shape[-1]
        q = q.reshape(*q.shape[:-1], heads, k.shape[-1]).mean(-2)  # the heads of one group read one key and value
        att = torch.softmax(q @ k.transpose(-1, -2) / k.shape[-1] ** 0.5, dim=-1)
        mlp = self.fc_out(torch.tanh(self.fc_in(h)))
        return self.head(self.o_proj(att @ v) + mlp + h)


class TinyGPT2Block(nn.Module):
    """transformers' ``Conv1D`` (GPT-2's c_attn / c_proj / c_fc: the weight stored as (in, out)) with and without
    a neighbouring ``nn.Linear``."""

    def __init__(self, dim: int = 6, n_out: int = 4) -> None:
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.c_fc = Conv1D(2 * dim, dim)
        self.c_proj = Conv1D(dim, 2 * dim)
        self.head = nn.Linear(dim, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.c_proj(torch.tanh(self.c_fc(x))) + x)


class TinySharedBlock(nn.Module):
    """One Linear applied ``calls`` times per forward (ALBERT's one shared layer, a weight-tied block) between an
    input and an output projection."""

    def __init__(self, dim: int = 6, calls: int = 3, n_out: int = 4) -> None:
        super().__init__()
        self.calls = calls
        self.inp = nn.Linear(dim, dim)
        self.shared = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for _ in range(self.calls):
            h = torch.tanh(self.shared(h)) + h
        return self.out(h)


class LearnedPositions(nn.Embedding):
    """OPT's learned position table: called with the attention mask, it looks up the positions (plus an offset) it
    computes from it."""

    offset = 2

    def __init__(self, positions: int, dim: int) -> None:
        super().__init__(positions + self.offset, dim)

    def forward(self, attention_mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        positions = (torch.cumsum(attention_mask, dim=1) * attention_mask - 1).long()
        return super().forward(positions + self.offset)


class ScaledWords(nn.Embedding):
    """BART's and Gemma's scaled word embedding: the looked-up rows times ``embed_scale``."""

    embed_scale = 3.0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(ids) * self.embed_scale


class TinyDecoderEmbeddings(nn.Module):
    """Scaled word embeddings plus a learned position table read from the attention mask, then a Linear head."""

    def __init__(self, vocab: int = 11, positions: int = 6, dim: int = 4, n_out: int = 3) -> None:
        super().__init__()
        self.words = ScaledWords(vocab, dim)
        self.positions = LearnedPositions(positions, dim)
        self.head = nn.Linear(dim, n_out)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.words(ids) + self.positions(attention_mask))
