"""The two ways of scaling a gradient rotated into K-FAC's eigenbasis (kaisa_ds.decomposition.scaling): the adaptive
one against a dense reference of its formula, its invariance to the gradient's scale, its running average kept across
decompositions and padding, its guard against a non-finite step, and the inverse method refusing it."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds.damping import Damping
from kaisa_ds.decomposition.decompose import decompose_all
from kaisa_ds.decomposition.registry import method_for
from kaisa_ds.decomposition.scaling import DECAY, RELATIVE_FLOOR, AdaptiveScaling
from kaisa_ds.enums import ComputeMethod, DampingMode, Eigenvalues
from kaisa_ds.precondition.grouped import GroupedPreconditioner

IN, OUT = 5, 4
DAMPING = Damping(DampingMode.RELATIVE, 10.0)


def _spd(n: int, seed: int) -> torch.Tensor:
    x = torch.randn(3 * n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (x.t() @ x / (3 * n)).float()


def _pairs(shift: int = 0) -> dict:
    """Two layers reading one A, each with its own G (``shift`` gives other factors: a new decomposition)."""
    factors = {"a": (_spd(IN, shift), False), "g1": (_spd(OUT, shift + 1), False),
               "g2": (_spd(OUT, shift + 2), False)}
    decs = decompose_all(factors, method=ComputeMethod.EIGEN, damping=DAMPING, compute_dtype=torch.float32,
                         out_dtype=torch.float32)
    return {"l1": (decs["a"], decs["g1"]), "l2": (decs["a"], decs["g2"])}


def _grads(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: scale * torch.randn(OUT, IN, generator=g) for n in ("l1", "l2")}


def _reference(pairs_per_step: list[dict], grads_per_step: list[dict]) -> dict[str, torch.Tensor]:
    """The formula written out densely, layer by layer: v ← β v + (1 − β) r², r / (√(v / (1 − βᵗ)) + ε·mean)."""
    second: dict[str, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for t, (pairs, grads) in enumerate(zip(pairs_per_step, grads_per_step), start=1):
        for name, (a, g) in pairs.items():
            rotated = g.eigvecs.t() @ grads[name] @ a.eigvecs
            second[name] = DECAY * second.get(name, torch.zeros_like(rotated)) + (1 - DECAY) * rotated**2
            root = (second[name] / (1 - DECAY**t)).sqrt()
            out[name] = g.eigvecs @ (rotated / (root + RELATIVE_FLOOR * root.mean())) @ a.eigvecs.t()
    return out


def test_adaptive_scaling_is_the_running_second_moment_in_the_eigenbasis_across_decompositions() -> None:
    pre = GroupedPreconditioner(method_for(ComputeMethod.EIGEN, eigenvalues=Eigenvalues.ADAPTIVE))
    pairs_seq = [_pairs(0), _pairs(0), _pairs(10)]  # the third step has new decompositions: v carries over
    grads_seq = [_grads(1), _grads(2), _grads(3)]
    got = {}
    for step, (pairs, grads) in enumerate(zip(pairs_seq, grads_seq)):
        if step == 2:
            pre.invalidate()
        got = pre.apply(grads, pairs, damping=DAMPING)
    want = _reference(pairs_seq, grads_seq)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_adaptive_scaling_ignores_the_gradients_scale_where_kronecker_is_linear_in_it() -> None:
    """Multiplying every gradient by c (a loss scale, another loss reduction) leaves the adaptive step unchanged:
    its floor is relative, and no absolute damping enters. K-FAC's own scaling, with the factors fixed, is linear."""
    outs = {}
    for ev in Eigenvalues:
        for c in (1.0, 1e3):
            pre = GroupedPreconditioner(method_for(ComputeMethod.EIGEN, eigenvalues=ev))
            for seed in (1, 2):
                res = pre.apply(_grads(seed, c), _pairs(), damping=Damping(DampingMode.ABSOLUTE, 0.1))
            outs[ev, c] = res["l1"]
    torch.testing.assert_close(outs[Eigenvalues.ADAPTIVE, 1e3], outs[Eigenvalues.ADAPTIVE, 1.0])
    torch.testing.assert_close(outs[Eigenvalues.KRONECKER, 1e3], 1e3 * outs[Eigenvalues.KRONECKER, 1.0], rtol=1e-5,
                               atol=0)  # linear


def test_padding_changes_no_number_and_the_state_is_exported_unpadded() -> None:
    runs = {}
    for align in (1, 8):
        pre = GroupedPreconditioner(method_for(ComputeMethod.EIGEN, eigenvalues=Eigenvalues.ADAPTIVE), align=align)
        for seed in (1, 2):
            runs[align] = pre.apply(_grads(seed), _pairs(), damping=DAMPING)
        state = pre.method.export_state()
        assert {n: (tuple(e["second"].shape), e["count"]) for n, e in state.items()} == {
            "l1": ((OUT, IN), 2), "l2": ((OUT, IN), 2)}
    for name in runs[1]:
        torch.testing.assert_close(runs[8][name], runs[1][name], rtol=1e-5, atol=1e-6)


def test_a_loaded_state_continues_as_if_uninterrupted() -> None:
    first = GroupedPreconditioner(method_for(ComputeMethod.EIGEN, eigenvalues=Eigenvalues.ADAPTIVE))
    for seed in (1, 2):
        first.apply(_grads(seed), _pairs(), damping=DAMPING)
    saved = first.method.export_state()
    second = GroupedPreconditioner(method_for(ComputeMethod.EIGEN, eigenvalues=Eigenvalues.ADAPTIVE))
    second.method.load_state(saved)
    want, got = first.apply(_grads(3), _pairs(), damping=DAMPING), second.apply(_grads(3), _pairs(), damping=DAMPING)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)


def test_a_non_finite_step_leaves_the_running_average_as_it_was() -> None:
    scaling = AdaptiveScaling()
    pre = GroupedPreconditioner(method_for(ComputeMethod.EIGEN, eigenvalues=Eigenvalues.ADAPTIVE))
    pre.method.scaling = scaling  # type: ignore[attr-defined]
    pre.apply(_grads(1), _pairs(), damping=DAMPING)
    before = {n: e["second"] for n, e in pre.method.export_state().items()}
    bad = _grads(2)
    bad["l1"][0, 0] = float("inf")
    pre.apply(bad, _pairs(), damping=DAMPING)  # the optimizer skips such a step; the averages must survive it
    after = pre.method.export_state()
    assert torch.isfinite(after["l1"]["second"]).all() and torch.isfinite(after["l2"]["second"]).all()
    assert not torch.equal(after["l2"]["second"], before["l2"])  # the finite layer averaged as usual


def test_the_inverse_method_has_no_eigenbasis_for_adaptive_eigenvalues() -> None:
    with pytest.raises(ValueError, match="no eigenbasis"):
        method_for(ComputeMethod.INVERSE, eigenvalues=Eigenvalues.ADAPTIVE)


def test_a_layer_leaving_its_group_keeps_its_averages_for_a_later_group() -> None:
    """Groups change with the structure (a layer without decompositions is applied raw for a while): l2 must not
    lose its second moments when l1 is grouped alone, nor l1 its own when both are grouped again."""
    pre = GroupedPreconditioner(method_for(ComputeMethod.EIGEN, eigenvalues=Eigenvalues.ADAPTIVE))
    pairs, grads = _pairs(), _grads(1)
    pre.apply(grads, pairs, damping=DAMPING)
    before = pre.method.export_state()
    pre.invalidate()
    pre.apply({"l1": grads["l1"]}, {"l1": pairs["l1"]}, damping=DAMPING)
    kept = pre.method.export_state()
    assert torch.equal(kept["l2"]["second"], before["l2"]["second"]) and kept["l2"]["count"] == 1
    assert kept["l1"]["count"] == 2
