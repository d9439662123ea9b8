"""Which modules K-FAC preconditions: a weight two modules share is left to the optimizer alone."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from kaisa_ds import KFACConfig
from kaisa_ds.layers.discovery import discover_layers


class TiedLM(nn.Module):
    """An embedding and an output projection sharing one weight, as BERT's MLM decoder and word embeddings do."""

    def __init__(self, vocab: int = 12, dim: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.decoder = nn.Linear(dim, vocab, bias=False)
        self.decoder.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder(torch.tanh(self.hidden(self.emb(ids))))


def test_a_shared_weight_is_preconditioned_by_neither_module(caplog: pytest.LogCaptureFixture) -> None:
    """The shared weight's gradient sums the embedding's and the decoder's contributions; the embedding's factors
    describe only the first (rows of tokens absent from the batch have A = 0, yet the decoder gives them a gradient),
    so preconditioning the sum with them is wrong. Before, the first owner (the embedding) was preconditioned."""
    with caplog.at_level(logging.WARNING, logger="kaisa_ds.layers.discovery"):
        layers = discover_layers(TiedLM(), KFACConfig())
    assert sorted(layers) == ["hidden"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "skipping emb, decoder" in warned and "share one weight" in warned


def test_untied_embeddings_and_decoders_are_preconditioned() -> None:
    model = TiedLM()
    model.decoder.weight = nn.Parameter(model.emb.weight.detach().clone())
    assert sorted(discover_layers(model, KFACConfig())) == ["decoder", "emb", "hidden"]


@pytest.mark.parametrize("skipped", ["emb", "decoder"])
def test_skipping_one_sharer_leaves_the_other_to_the_optimizer(skipped: str) -> None:
    """``skip_layers: ["embeddings"]`` on BERT skips the word embeddings but not the MLM decoder tied to them. The
    weight is still shared, so its gradient still sums both modules' contributions, and the decoder must not be
    preconditioned with its own factors alone. Before, sharers were counted among the unskipped modules only: the
    decoder became a K-FAC layer (on BERT-mini with an 8,192-token vocabulary, a dense 8,192² G that took 70 s to
    decompose, on a gradient its factors do not describe)."""
    layers = discover_layers(TiedLM(), KFACConfig(skip_layers=[skipped]))
    assert sorted(layers) == ["hidden"]


class MLPBlock(nn.Module):
    """A transformer MLP: the intermediate layer's output and the output layer's input are 4x the hidden width."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.attn = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.attn(x))))


def test_the_default_rotates_only_the_narrow_side_of_a_transformer_mlp() -> None:
    """Amendment 9 of batch_scaling.md: ``{"enabled": true}`` keeps the MLP's wide side (the intermediate layer's G,
    the output layer's A) as its diagonal (a third of the step's overhead at BERT-mini's smallest batch); a square
    layer keeps both sides whole, and ``"max_factor_ratio": null`` gives back both sides rotated everywhere."""
    sides = {name: (layer.a.diagonal, layer.g.diagonal)
             for name, layer in discover_layers(MLPBlock(), KFACConfig.from_dict({})).items()}
    assert sides == {"attn": (False, False), "up": (False, True), "down": (True, False)}
    both = discover_layers(MLPBlock(), KFACConfig.from_dict({"max_factor_ratio": None}))
    assert all(not (layer.a.diagonal or layer.g.diagonal) for layer in both.values())
