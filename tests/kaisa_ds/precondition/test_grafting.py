"""Grafting (``KFACConfig.grafting="gradient"``): each layer's preconditioned gradient leaves K-FAC at its raw
gradient's norm and in K-FAC's own direction, which still differs from the raw gradient's."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from kaisa_ds import Grafting, KFACConfig
from kaisa_ds.precondition.apply import graft
from tests.kaisa_ds.precondition.test_scale_invariance import cosines, preconditioned


def _layer_norms(grads: dict[str, torch.Tensor]) -> dict[str, float]:
    """Norm per module (weight and bias together, as K-FAC preconditions them)."""
    sums: dict[str, float] = defaultdict(float)
    for name, g in grads.items():
        sums[name.rsplit(".", 1)[0]] += float(g.double().pow(2).sum())
    return {layer: total**0.5 for layer, total in sums.items()}


def test_graft_keeps_each_direction_at_the_gradients_norm() -> None:
    g = torch.Generator().manual_seed(0)
    pre = [torch.randn(4, 3, generator=g) * 50, torch.zeros(2, 2), torch.randn(5, generator=g).bfloat16()]
    grads = [torch.randn(4, 3, generator=g), torch.randn(2, 2, generator=g), torch.randn(5, generator=g)]
    out = graft(pre, grads)
    assert torch.allclose(out[0].norm(), grads[0].norm(), rtol=1e-5)
    assert float(torch.nn.functional.cosine_similarity(out[0].flatten(), pre[0].flatten(), dim=0)) > 1 - 1e-6
    assert torch.equal(out[1], pre[1])  # nothing to scale: left as is, not NaN
    assert out[2].dtype == torch.bfloat16
    assert torch.allclose(out[2].float().norm(), grads[2].norm(), rtol=2e-2)


@pytest.mark.parametrize("method", ["eigen", "inverse"])
def test_grafted_step_has_raw_norms_and_kfac_directions(method: str) -> None:
    raw, plain = preconditioned(1.0, compute_method=method, kl_clip=None, grafting="none")
    _, grafted = preconditioned(1.0, compute_method=method, kl_clip=None, grafting="gradient")
    raw_norms, plain_norms, grafted_norms = _layer_norms(raw), _layer_norms(plain), _layer_norms(grafted)
    # without grafting the sizes are K-FAC's own, far from the gradient's (so the test can fail)
    assert max(abs(plain_norms[k] / raw_norms[k] - 1) for k in raw_norms) > 0.5
    for layer, norm in raw_norms.items():
        assert grafted_norms[layer] == pytest.approx(norm, rel=1e-6), layer
    assert min(cosines(plain, grafted).values()) > 1 - 1e-9  # same direction as K-FAC's
    assert min(cosines(raw, grafted).values()) < 0.99  # and still not the raw gradient's


def test_grafted_size_follows_the_gradient_not_the_loss_scale_of_kfac() -> None:
    """K-FAC's own size grows as 1/c when the loss is scaled by c (relative damping); grafted, it grows as c."""
    for c in (1e-2, 1e2):
        raw, grafted = preconditioned(c, kl_clip=None, grafting="gradient")
        for layer, norm in _layer_norms(raw).items():
            assert _layer_norms(grafted)[layer] == pytest.approx(norm, rel=1e-6)


def test_grafting_takes_strings_and_names_the_key_when_wrong() -> None:
    assert KFACConfig(grafting="GRADIENT").grafting is Grafting.GRADIENT
    with pytest.raises(ValueError, match=r"grafting='norm'.*'none', 'gradient', 'kfac-size'"):
        KFACConfig(grafting="norm")


def test_kfac_size_ablation_keeps_the_gradients_direction_at_kfacs_size_and_clip() -> None:
    raw, kfac = preconditioned(1.0, kl_clip=1e-3, lr=10.0, grafting="none")  # a binding clip: ν is in its size
    _, unclipped = preconditioned(1.0, kl_clip=None, grafting="none")
    _, ablation = preconditioned(1.0, kl_clip=1e-3, lr=10.0, grafting="kfac-size")
    kfac_norms, unclipped_norms = _layer_norms(kfac), _layer_norms(unclipped)
    assert max(kfac_norms[k] / unclipped_norms[k] for k in kfac_norms) < 0.5  # the clip did bind
    for layer, norm in _layer_norms(ablation).items():
        assert norm == pytest.approx(kfac_norms[layer], rel=1e-6), layer
    moving = {n for n, g in raw.items() if float(g.norm()) > 1e-12}  # e.g. the key's bias gets no gradient
    assert min(c for n, c in cosines(raw, ablation).items() if n in moving) > 1 - 1e-9


def test_the_default_step_keeps_each_layers_raw_size_and_an_ungrafted_one_keeps_kaisas_clip() -> None:
    """defaults_rule_6.md: what ``"kfac": {"enabled": true}`` hands the optimizer has the raw gradients' sizes, so
    LAMB's global norm stays its own; asking for ``grafting="none"`` brings back KAISA's step, KL clip included."""
    raw, default = preconditioned(1.0, lr=10.0)  # an lr at which a KL clip of 0.001 binds
    _, unclipped = preconditioned(1.0, lr=10.0, grafting="none", kl_clip=None)
    _, kaisa = preconditioned(1.0, lr=10.0, grafting="none")
    for layer, norm in _layer_norms(raw).items():
        assert _layer_norms(default)[layer] == pytest.approx(norm, rel=1e-6), layer
    assert min(cosines(unclipped, default).values()) > 1 - 1e-9  # K-FAC's direction
    ratios = {k: _layer_norms(kaisa)[k] / v for k, v in _layer_norms(unclipped).items()}
    assert max(ratios.values()) < 0.5  # the clip (0.001) binds on the ungrafted step
    assert max(ratios.values()) == pytest.approx(min(ratios.values()), rel=1e-6)  # one ν for every layer
    assert KFACConfig(grafting="none").kl_clip == pytest.approx(0.001)
    with pytest.raises(ValueError, match=r"kl_clip='off'.*'auto'"):
        KFACConfig(kl_clip="off")
