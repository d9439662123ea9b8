"""The noise probe of a run without K-FAC, through a real DeepSpeed engine (2 accumulated passes, in a process of its
own: no process group or distributed environment is left behind in the test session): its two gradient norms
against the ones computed by hand from each pass's own backward, so a wrong reading of DeepSpeed's conventions (the
loss divided by the passes, the reduced gradient on the boundary) fails."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.support.launch import run_distributed


def _probe_against_hand(rank: int, world: int) -> dict[str, Any]:
    import kaisa_ds
    from kaisa_ds.engine.noise_probe import EngineNoiseProbe
    from tests.support.models import TinyMLP

    os.environ.setdefault("LOCAL_RANK", str(rank))  # deepspeed.initialize asks for it (gloo is already up)
    torch.manual_seed(0)
    model, reference = TinyMLP(), TinyMLP()
    reference.load_state_dict(model.state_dict())
    engine, *_ = kaisa_ds.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.0}}})  # lr 0: every step sees the same weights
    probe = EngineNoiseProbe(engine, samples_per_pass=4, world=world, every=1, smoothing=0.0)
    xs = torch.randn(2, 4, reference.fc1.in_features)
    ys = torch.zeros(2, 4, dtype=torch.long)  # one class: a gradient the passes share
    probe.begin_step()
    for x, y in zip(xs, ys):
        engine.backward(F.cross_entropy(engine(x), y))
        if engine.is_gradient_accumulation_boundary():
            probe.at_boundary()
        engine.step()
    per_pass = []  # by hand: each pass's mean-loss gradient, and their mean (the step's gradient)
    for x, y in zip(xs, ys):
        reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        per_pass.append(torch.cat([p.grad.flatten() for p in reference.parameters() if p.grad is not None]))
    assert probe.noise.grad_sq is not None and probe.noise.trace is not None
    return {"small": float(torch.stack([g.pow(2).sum() for g in per_pass]).mean()),
            "big": float(torch.stack(per_pass).mean(0).pow(2).sum()),
            "grad_sq": float(probe.noise.grad_sq), "trace": float(probe.noise.trace), "snapshot": probe.snapshot()}


def test_the_probe_reads_the_pass_and_step_norms_deepspeed_makes() -> None:
    (got,) = run_distributed(_probe_against_hand, 1)
    b, big_b = 4.0, 8.0
    grad_sq = (big_b * got["big"] - b * got["small"]) / (big_b - b)
    trace = (got["small"] - got["big"]) / (1 / b - 1 / big_b)
    assert got["grad_sq"] == pytest.approx(grad_sq, rel=1e-4)
    assert got["trace"] == pytest.approx(trace, rel=1e-4)
    snapshot = got["snapshot"]
    assert grad_sq > 0 and snapshot is not None
    assert snapshot["samples_per_step"] == 8 and snapshot["b_simple"] == pytest.approx(trace / grad_sq, rel=1e-3)
