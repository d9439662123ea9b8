"""Issue 20's targets on BERT-tiny MLM (untrained, random tokens) with the library's damping defaults: the loss's
scale does not move any preconditioned direction, K-FAC still differs from the raw gradient, and the effectiveness
check warns for the old absolute 1e-3 but not for the default. ``skip_layers=KAISA_SKIP`` (the 30,522-wide decoder
and the embeddings) is the model's requirement, not a damping option. The figures are printed (``pytest -s``)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from benchmarks.harness.batches import random_batch
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from kaisa_ds import KFACPreconditioner
from kaisa_ds.plan.bert_sizes import KAISA_SKIP
from tests.kaisa_ds.precondition.test_scale_invariance import cosines

SEQ = 32
BATCHES = [random_batch(16, SEQ, 30522, "cpu", seed=s) for s in range(2)]


def run(c: float, **options: Any) -> tuple[KFACPreconditioner, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(preconditioner, raw, preconditioned gradients of its weights) after two steps on a fixed BERT-tiny."""
    model = bert_for_pretraining("tiny", seq=SEQ)
    precond = KFACPreconditioner(model, skip_layers=KAISA_SKIP, **options)
    watched = {f"{n}.weight" for n in precond.layers}
    raw: dict[str, torch.Tensor] = {}
    for batch in BATCHES:
        model.zero_grad()
        (pretraining_loss(model, batch) * c).backward()
        raw = {n: p.grad.clone() for n, p in model.named_parameters() if n in watched and p.grad is not None}
        precond.step()
    return precond, raw, {n: p.grad.clone() for n, p in model.named_parameters()
                          if n in watched and p.grad is not None}


@pytest.fixture(scope="module")
def base() -> tuple[KFACPreconditioner, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    return run(1.0, eigenvalues="kronecker")


def test_default_damping_ignores_the_loss_scale_and_still_preconditions(base: Any) -> None:
    """K-FAC's own eigenvalues with the default relative damping (what a damping option asks for)."""
    _, raw, pre = base
    worst = {c: min(cosines(run(c, eigenvalues="kronecker")[2], pre).values()) for c in (1e-3, 1e3)}
    to_raw = cosines(pre, raw)
    mean_to_raw = sum(to_raw.values()) / len(to_raw)
    print(f"\nBERT-tiny, library defaults: worst per-weight cosine under loss x 1e-3 {worst[1e-3]:.5f}, "
          f"x 1e3 {worst[1e3]:.5f}; mean cosine to the raw gradient {mean_to_raw:.4f}")
    assert min(worst.values()) >= 0.999
    assert mean_to_raw < 0.99


def test_old_absolute_damping_warns_and_the_default_does_not(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kaisa_ds")
    precond, _, _ = run(1.0, damping=1e-3)
    rescaled = [r.getMessage() for r in caplog.records if "rescaled gradient" in r.getMessage()]
    assert len(rescaled) == 1 and "damping=0.001 (absolute)" in rescaled[0] and "attention.self.query" in rescaled[0]
    assert all(f["cosine"] > 0.99 for f in precond.diagnostics_snapshot()["effectiveness"].values())
    caplog.clear()
    default = run(1.0)[0]
    assert default.diagnostics.effectiveness  # measured, and nothing to warn about
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("kaisa_ds.precondition")]


def test_adaptive_eigenvalues_mostly_ignore_the_loss_scale_and_still_precondition() -> None:
    """The default eigenvalues divide each rotated entry by its own measured size. Scaling the loss leaves that
    invariant in exact arithmetic, but the factors' eigenbasis inside their near-null subspace is set by rounding,
    and there the adaptive step gives each entry unit size: most weights keep their direction, a few do not (seen:
    median cosine 0.96, worst 0.69, two steps in fp32; docs/math.md). Both bounds are checked, so a change that made
    it worse, or the claim stale, fails."""
    _, raw, pre = run(1.0)
    for c in (1e-3, 1e3):
        values = sorted(cosines(run(c)[2], pre).values())
        assert values[len(values) // 2] >= 0.95 and values[0] >= 0.6, (c, values[:3])
    to_raw = cosines(pre, raw)
    assert sum(to_raw.values()) / len(to_raw) < 0.99
