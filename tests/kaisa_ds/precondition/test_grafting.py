"""Grafting (``KFACConfig.grafting="gradient"``): each layer's preconditioned gradient leaves K-FAC at its raw
gradient's norm and in K-FAC's own direction, which still differs from the raw gradient's."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from kaisa_ds import Grafting, KFACConfig
from kaisa_ds.precondition.apply import size_step
from tests.kaisa_ds.precondition.test_scale_invariance import cosines, preconditioned

GRAFTED_DAMPING = KFACConfig().damping_at(0).value  # the default step's: an ungrafted twin shares its direction


def _layer_norms(grads: dict[str, torch.Tensor]) -> dict[str, float]:
    """Norm per module (weight and bias together, as K-FAC preconditions them)."""
    sums: dict[str, float] = defaultdict(float)
    for name, g in grads.items():
        sums[name.rsplit(".", 1)[0]] += float(g.double().pow(2).sum())
    return {layer: total**0.5 for layer, total in sums.items()}


def _at_norms_of(directions: list[torch.Tensor], sizes: list[torch.Tensor]) -> list[torch.Tensor]:
    """The grafting rule written out by hand, one tensor at a time (a zero direction stays zero)."""
    return [d * (s.norm() / d.norm()) if float(d.norm()) > 0 else d for d, s in zip(directions, sizes)]


def test_graft_keeps_each_direction_at_the_gradients_norm() -> None:
    g = torch.Generator().manual_seed(0)
    pre = [torch.randn(4, 3, generator=g) * 50, torch.zeros(2, 2), torch.randn(5, generator=g).bfloat16()]
    grads = [torch.randn(4, 3, generator=g), torch.randn(2, 2, generator=g), torch.randn(5, generator=g)]
    out = size_step(pre, grads, grafting=Grafting.GRADIENT, lr=0.1, kl_clip=None).tensors()
    assert torch.allclose(out[0].norm(), grads[0].norm(), rtol=1e-5)
    assert float(torch.nn.functional.cosine_similarity(out[0].flatten(), pre[0].flatten(), dim=0)) > 1 - 1e-6
    assert torch.equal(out[1], pre[1])  # nothing to scale: left as is, not NaN
    assert out[2].dtype == torch.bfloat16
    assert torch.allclose(out[2].float().norm(), grads[2].norm(), rtol=2e-2)


@pytest.mark.parametrize("method", ["eigen", "inverse"])
def test_grafted_step_has_raw_norms_and_kfac_directions(method: str) -> None:
    raw, plain = preconditioned(1.0, compute_method=method, kl_clip=None, grafting="none",
                                relative_damping=GRAFTED_DAMPING)
    _, grafted = preconditioned(1.0, compute_method=method, kl_clip=None, grafting="gradient", eigenvalues="kronecker")
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
    _, kronecker = preconditioned(1.0, lr=10.0, eigenvalues="kronecker")  # the default's step with K-FAC's eigenvalues
    _, unclipped = preconditioned(1.0, lr=10.0, grafting="none", kl_clip=None)
    _, kaisa = preconditioned(1.0, lr=10.0, grafting="none")
    _, direction = preconditioned(1.0, lr=10.0, grafting="none", kl_clip=None, relative_damping=GRAFTED_DAMPING)
    for layer, norm in _layer_norms(raw).items():
        assert _layer_norms(default)[layer] == pytest.approx(norm, rel=1e-6), layer
    for layer, norm in _layer_norms(raw).items():
        assert _layer_norms(kronecker)[layer] == pytest.approx(norm, rel=1e-6), layer
    assert min(cosines(direction, kronecker).values()) > 1 - 1e-9  # K-FAC's direction at the default's damping
    ratios = {k: _layer_norms(kaisa)[k] / v for k, v in _layer_norms(unclipped).items()}
    assert max(ratios.values()) < 0.5  # the clip (0.001) binds on the ungrafted step
    assert max(ratios.values()) == pytest.approx(min(ratios.values()), rel=1e-6)  # one ν for every layer
    assert KFACConfig(grafting="none").value("kl_clip", 0) == pytest.approx(0.001)
    with pytest.raises(ValueError, match=r"kl_clip='off'.*'auto'"):
        KFACConfig(kl_clip="off")


@pytest.mark.parametrize("grafting", list(Grafting))
def test_one_factor_per_layer_gives_the_step_its_rules_define_one_after_another(grafting: Grafting) -> None:
    """The step folds grafting, the KL clip and the loss scale into one multiply per layer; the result must be the
    step the rules give applied in turn (ν measured on the grafted step; ``kfac-size`` after ν)."""
    g = torch.Generator().manual_seed(1)
    pre = [torch.randn(4, 3, generator=g) * 30, torch.randn(6, generator=g) * 0.1, torch.zeros(2, 2)]
    raw = [torch.randn(4, 3, generator=g), torch.randn(6, generator=g), torch.randn(2, 2, generator=g)]
    lr, kl, loss_scale = 10.0, 1e-3, 8.0
    steps = _at_norms_of(pre, raw) if grafting is Grafting.GRADIENT else pre
    nu = min(1.0, (kl / (lr**2 * abs(sum(float((s * r).sum()) for s, r in zip(steps, raw))))) ** 0.5)
    if grafting is Grafting.KFAC_SIZE:
        steps = _at_norms_of(raw, steps)
    sized = size_step(pre, raw, grafting=grafting, lr=lr, kl_clip=kl, loss_scale=loss_scale)
    assert nu < 0.5  # the clip binds, so a ν measured on the wrong step would show
    assert sized.nu is not None and float(sized.nu) == pytest.approx(nu, rel=1e-5)
    for got, step in zip(sized.tensors(), steps):
        assert torch.allclose(got, step * nu * loss_scale, rtol=1e-5, atol=1e-6)


def test_a_step_without_rules_hands_on_the_preconditioned_gradients_untouched() -> None:
    pre, raw = [torch.randn(3, 2)], [torch.randn(3, 2)]
    sized = size_step(pre, raw, grafting=Grafting.NONE, lr=0.1, kl_clip=None)
    assert sized.nu is None and sized.tensors()[0] is pre[0]  # no multiply at all
    assert size_step([], [], grafting=Grafting.GRADIENT, lr=0.1, kl_clip=1e-3).tensors() == []


@pytest.mark.parametrize("grafting", [Grafting.GRADIENT, Grafting.KFAC_SIZE])
def test_gradient_norms_handed_in_are_the_sizes_used(grafting: Grafting) -> None:
    """The step passes the overflow check's FP32 norms of the gradients: the sized step is the one the step would
    have computed, and it follows the norms handed in (they are used, not recomputed)."""
    g = torch.Generator().manual_seed(3)
    pre = [torch.randn(4, 3, generator=g) * 7, torch.randn(6, generator=g)]
    grads = [torch.randn(4, 3, generator=g), torch.randn(6, generator=g)]
    norms = torch.stack([t.norm() for t in grads])
    common = {"grafting": grafting, "lr": 0.1, "kl_clip": None}
    own = size_step(pre, grads, **common).tensors()  # type: ignore[arg-type]
    given = size_step(pre, grads, grad_norms=norms, **common).tensors()  # type: ignore[arg-type]
    doubled = size_step(pre, grads, grad_norms=norms * torch.tensor([2.0, 1.0]), **common).tensors()  # type: ignore[arg-type]
    for a, b in zip(own, given):
        assert torch.allclose(a, b, rtol=1e-6)
    if grafting is Grafting.GRADIENT:  # the first layer is grafted onto twice its gradient's size
        assert torch.allclose(doubled[0], 2 * own[0], rtol=1e-6) and torch.allclose(doubled[1], own[1])
    else:  # the gradient's own norm is the direction's: twice it halves the step
        assert torch.allclose(doubled[0], own[0] / 2, rtol=1e-6) and torch.allclose(doubled[1], own[1])


def test_a_half_precision_direction_past_fp16s_range_is_still_grafted() -> None:
    """Grafting's norms are taken in FP32: an FP16 direction whose norm passes FP16's largest value (65,504) while
    every entry is finite is brought to the gradient's norm, not multiplied by 0 (an FP16 norm of inf)."""
    pre = [torch.full((4096,), 2000.0, dtype=torch.float16)]  # norm 128,000
    grads = [torch.full((4096,), 0.5)]  # norm 32
    out = size_step(pre, grads, grafting=Grafting.GRADIENT, lr=0.1, kl_clip=None).tensors()
    assert out[0].dtype == torch.float16
    assert out[0].float().norm().item() == pytest.approx(32.0, rel=1e-2)
