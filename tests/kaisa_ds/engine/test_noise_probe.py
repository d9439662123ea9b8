"""The noise probe of a run without K-FAC, through a real DeepSpeed engine (one process, 2 accumulated passes):
its two gradient norms against the ones computed by hand from each pass's own backward, so a wrong reading of
DeepSpeed's conventions (the loss divided by the passes, the reduced gradient on the boundary) fails."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from kaisa_ds.engine.noise_probe import EngineNoiseProbe
from tests.support.models import TinyMLP


@pytest.fixture(scope="module")
def dist_env() -> None:
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "RANK": "0", "LOCAL_RANK": "0",
                       "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)


def test_the_probe_reads_the_pass_and_step_norms_deepspeed_makes(dist_env: None) -> None:
    import deepspeed

    torch.manual_seed(0)
    model = TinyMLP()
    reference = TinyMLP()
    reference.load_state_dict(model.state_dict())
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.0}}})  # lr 0: every step sees the same weights
    probe = EngineNoiseProbe(engine, samples_per_pass=4, world=1, every=1, smoothing=0.0)
    xs = torch.randn(2, 4, reference.fc1.in_features)
    ys = torch.zeros(2, 4, dtype=torch.long)  # one class: a gradient the passes share
    probe.begin_step()
    for x, y in zip(xs, ys):
        engine.backward(F.cross_entropy(engine(x), y))
        if engine.is_gradient_accumulation_boundary():
            probe.at_boundary()
        engine.step()
    # by hand: each pass's mean-loss gradient, and their mean (the step's gradient)
    per_pass = []
    for x, y in zip(xs, ys):
        reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        per_pass.append(torch.cat([p.grad.flatten() for p in reference.parameters() if p.grad is not None]))
    small = torch.stack([g.pow(2).sum() for g in per_pass]).mean()
    big = torch.stack(per_pass).mean(0).pow(2).sum()
    b, big_b = 4.0, 8.0
    grad_sq = (big_b * big - b * small) / (big_b - b)
    trace = (small - big) / (1 / b - 1 / big_b)
    assert probe.noise.grad_sq is not None and probe.noise.trace is not None
    assert float(probe.noise.grad_sq) == pytest.approx(float(grad_sq), rel=1e-4)
    assert float(probe.noise.trace) == pytest.approx(float(trace), rel=1e-4)
    snapshot = probe.snapshot()
    assert float(grad_sq) > 0 and snapshot is not None
    assert snapshot["samples_per_step"] == 8 and snapshot["b_simple"] == pytest.approx(float(trace / grad_sq), rel=1e-3)
