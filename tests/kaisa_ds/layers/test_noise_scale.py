"""The gradient noise scale against its definition: per-sample gradients ``x_s ~ N(μ, σ² I)`` in ``d`` dimensions
have ``tr(Σ) = d σ²`` and ``|G|² = |μ|²``, so ``B_simple = d σ² / |μ|²``; measured from the per-pass and the step's
gradient norms of accumulated micro-batches, as a training loop makes them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kaisa_ds.layers.noise_scale import NoiseScale


@pytest.mark.parametrize(("sigma", "passes"), [(1.0, 4), (2.0, 2)])
def test_b_simple_matches_the_noise_of_known_per_sample_gradients(sigma: float, passes: int) -> None:
    d, batch, mu = 50, 8, 0.5
    true = d * sigma**2 / (d * mu**2)  # 4 at sigma 1, 16 at sigma 2
    layer = nn.Linear(d, 1, bias=False)
    noise = NoiseScale(layer.parameters(), smoothing=0.98)
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        layer.zero_grad()
        noise.start()
        for _ in range(passes):  # the loss of a pass is its mean over samples, divided by the passes
            x = mu + sigma * torch.randn(batch, d, generator=g)
            (layer(x).mean() / passes).backward()  # d loss / d w = mean(x) / passes
        noise.update(layer.weight.grad.pow(2).sum(), samples_per_pass=batch, passes=passes, world=1,
                     grad_scale=1.0 / passes)
    estimate = noise.b_simple()
    assert estimate is not None and estimate == pytest.approx(true, rel=0.2), (estimate, true)
    assert noise.last == {"samples_per_pass": batch, "samples_per_step": batch * passes}


def test_one_pass_on_one_rank_measures_nothing() -> None:
    layer = nn.Linear(4, 1)
    noise = NoiseScale(layer.parameters())
    noise.start()
    layer(torch.randn(3, 4)).mean().backward()
    noise.update(torch.tensor(1.0), samples_per_pass=3, passes=1, world=1)
    assert noise.b_simple() is None and not noise.measuring
    layer.zero_grad()
    layer(torch.randn(3, 4)).mean().backward()  # the hooks are gone once a step is folded in
    assert noise._pass_sq is not None  # the measured pass only


def test_an_overflowed_step_leaves_the_estimate_as_it_was() -> None:
    """An fp16 overflow makes a step's gradients infinite: folding it in would make the average inf or NaN for good."""
    layer = nn.Linear(4, 1, bias=False)
    noise = NoiseScale(layer.parameters(), smoothing=0.5)

    def step(grad_sq: float, passes: list[float]) -> None:
        noise.start()
        for value in passes:
            noise._add(torch.full((1, 4), value))
        noise.update(torch.tensor(grad_sq), samples_per_pass=2, passes=len(passes), world=1)

    step(float("inf"), [float("inf"), 1.0])  # the first step overflowed: nothing measured yet
    assert noise.b_simple() is None
    step(6.25, [1.0, 1.5])  # |G|² of the passes' mean gradient (1.25 in each of 4 entries)
    before = noise.b_simple()
    assert before is not None
    step(float("inf"), [float("inf"), 1.0])
    assert noise.b_simple() == before


def test_the_preconditioner_measures_the_noise_scale_of_its_layers() -> None:
    """Through KFACPreconditioner: every 10th step measured from the per-pass hooks and the check's gradient norms,
    in diagnostics_snapshot() (so metrics.jsonl and the monitor) with the batch it was measured at."""
    from kaisa_ds import KFACPreconditioner

    d, batch, passes, mu = 50, 8, 4, 0.5
    torch.manual_seed(0)
    layer = nn.Linear(d, 1, bias=False)
    precond = KFACPreconditioner(layer, factor_update_steps=50, inv_update_steps=50)
    g = torch.Generator().manual_seed(1)
    for _ in range(1000):
        layer.zero_grad()
        for _ in range(passes):
            (layer(mu + torch.randn(batch, d, generator=g)).mean() / passes).backward()
        precond.step()  # no optimizer step: the gradient's distribution stays the same
    noise = precond.diagnostics_snapshot()["noise_scale"]
    assert noise["samples_per_pass"] == batch and noise["samples_per_step"] == batch * passes
    assert noise["b_simple"] == pytest.approx(d / (d * mu**2), rel=0.35), noise
