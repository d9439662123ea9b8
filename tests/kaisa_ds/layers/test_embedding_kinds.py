"""Embeddings that are not called with the ids they look up: a learned position table (OPT, BART) counts the
positions it computes, and a scaled word embedding (BART, Gemma) scales G by the square of its scale."""

from __future__ import annotations

import torch

from kaisa_ds import KFACPreconditioner
from tests.support.models import TinyDecoderEmbeddings


def test_position_table_counts_the_positions_it_looks_up_and_scaled_words_scale_g() -> None:
    torch.manual_seed(0)
    model = TinyDecoderEmbeddings()
    grads: dict[str, torch.Tensor] = {}

    def keep(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
        out.register_hook(lambda g: grads.__setitem__("words", g))

    model.words.register_forward_hook(keep)
    precond = KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=1)
    ids = torch.randint(0, 11, (3, 5))
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[0, 3:] = 0  # a padded sequence: its padded positions look up row offset - 1 = 1
    model(ids, mask).pow(2).mean().backward()
    precond.step()
    positions = (torch.cumsum(mask, 1) * mask - 1) + model.positions.offset
    want = torch.bincount(positions.reshape(-1), minlength=model.positions.num_embeddings).float() / positions.numel()
    torch.testing.assert_close(precond.layers["positions"].a.value, want)
    # G of the table: the gradient reaching its rows is the output's times the scale
    g = grads["words"].reshape(-1, 4).double() * 3 * model.words.embed_scale  # × batch (mean loss) × scale
    torch.testing.assert_close(precond.layers["words"].g_factor.double(), g.t() @ g / g.shape[0], rtol=1e-5,
                               atol=1e-8)
    assert precond.coverage.share == 1.0
