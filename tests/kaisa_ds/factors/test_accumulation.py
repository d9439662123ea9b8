"""Factors of one global batch do not depend on accumulation passes, loss scale or storage dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kaisa_ds import KFACPreconditioner
from kaisa_ds.factors.factor import KroneckerFactor
from tests.support.models import TinyTransformerish
from tests.support.training import EVERY_STEP


def _factors_after_one_step(passes: int, loss_scale: float = 1.0, **kwargs: object) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, loss_scale=lambda: loss_scale, kl_clip=None,  # type: ignore[arg-type]
                                 eigenvalues="kronecker", **kwargs)  # linear in the gradient: compared at 1e-4
    g = torch.Generator().manual_seed(5)
    ids, target = torch.randint(0, 11, (8, 5), generator=g), torch.randn(8, 5, 5, generator=g)
    for ids_i, t_i in zip(ids.chunk(passes), target.chunk(passes)):
        (F.mse_loss(model(ids_i), t_i) / passes * loss_scale).backward()
    precond.step()
    out = {}
    for name, layer in precond.layers.items():
        out[f"{name}.A"], out[f"{name}.G"] = layer.a_factor.float(), layer.g_factor.float()
    out["grad"] = model.out.weight.grad.clone() / loss_scale
    return out


@pytest.mark.parametrize(("passes", "scale"), [(4, 1.0), (2, 1.0), (1, 1024.0), (4, 65536.0)])
def test_factors_and_gradients_independent_of_passes_and_loss_scale(passes: int, scale: float) -> None:
    ref = _factors_after_one_step(1)
    got = _factors_after_one_step(passes, scale)
    for key in ref:
        torch.testing.assert_close(got[key], ref[key], rtol=1e-4, atol=1e-6, msg=lambda m, k=key: f"{k}: {m}")


def test_window_buffer_does_not_grow_with_passes() -> None:
    f = KroneckerFactor("x", 16, diagonal=False, storage_dtype=None, scale_by_passes=False)
    f.add(torch.eye(16), 4)
    size = f.nbytes()
    for _ in range(20):
        f.add(torch.eye(16), 4)
    assert f.nbytes() == size


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_storage_halves_factor_memory_and_stays_close(dtype: torch.dtype) -> None:
    ref = _factors_after_one_step(1)
    half = _factors_after_one_step(1, factor_dtype=dtype)
    for key in ref:
        if key != "grad":
            torch.testing.assert_close(half[key], ref[key], rtol=2e-2, atol=1e-3)
    torch.manual_seed(0)
    m32, m16 = TinyTransformerish(), TinyTransformerish()
    p32, p16 = KFACPreconditioner(m32), KFACPreconditioner(m16, factor_dtype=dtype)
    ids = torch.randint(0, 11, (4, 5))
    for m, p in ((m32, p32), (m16, p16)):
        m(ids).sum().backward()
        p.step()
        assert all(f.export()["value"].dtype == (dtype if p is p16 else torch.float32)  # type: ignore[union-attr]
                   for f in p.factors().values())
    assert p16.memory_usage()["factors"] * 2 == p32.memory_usage()["factors"]


def test_running_average_starts_from_first_window_then_decays() -> None:
    f = KroneckerFactor("x", 2, diagonal=False, storage_dtype=None, scale_by_passes=False)
    f.commit(torch.eye(2) * 4, 0.9)
    torch.testing.assert_close(f.value, torch.eye(2) * 4)
    f.commit(torch.eye(2) * 2, 0.9)
    torch.testing.assert_close(f.value, torch.eye(2) * (0.9 * 4 + 0.1 * 2))


def test_summed_loss_reduction_skips_batch_scaling() -> None:
    mean = _factors_after_one_step(1)
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, loss_reduction="sum", kl_clip=None)
    g = torch.Generator().manual_seed(5)
    ids, target = torch.randint(0, 11, (8, 5), generator=g), torch.randn(8, 5, 5, generator=g)
    # a summed loss over the 8 sequences has per-sequence gradients 8x those of the averaged loss
    (F.mse_loss(model(ids), target, reduction="none").mean(dim=(1, 2)).sum()).backward()
    precond.step()
    torch.testing.assert_close(precond.layers["out"].g_factor, mean["out.G"], rtol=1e-4, atol=1e-6)


def _realistic_g(dim: int, magnitude: float, seed: int) -> torch.Tensor:
    """A G-like factor: SPD, entries around ``magnitude`` (real BERT G factors sit at 1e-12..1e-6)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4 * dim, dim, generator=g) * torch.logspace(0, -2, dim)  # spread spectrum
    return (x.T @ x / (4 * dim)) * magnitude


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("magnitude", [1e-9, 1e-6, 1.0, 1e4])
def test_half_storage_keeps_tiny_and_large_factors(dtype: torch.dtype, magnitude: float) -> None:
    """Values below FP16's normal range (6e-5) or above its max (65504) survive storage and decay."""
    f = KroneckerFactor("g", 48, diagonal=False, storage_dtype=dtype, scale_by_passes=False)
    ref = _realistic_g(48, magnitude, 0)
    f.commit(ref.clone(), 0.9)
    new = _realistic_g(48, magnitude, 1)
    f.commit(new.clone(), 0.9)
    expected = 0.9 * ref + 0.1 * new
    got = f.value
    assert got is not None and torch.isfinite(got).all()
    tol = 2e-3 if dtype == torch.float16 else 2e-2  # relative to the largest entry: 11 vs 8 significant bits
    assert (got - expected).abs().max() <= tol * expected.abs().max()
    eig_got, eig_ref = torch.linalg.eigvalsh(got.double()), torch.linalg.eigvalsh(expected.double())
    assert eig_got.max() == pytest.approx(eig_ref.max().item(), rel=tol)
    assert f.nbytes() == 48 * 48 * 2


def test_half_storage_preconditions_like_fp32_at_realistic_gradient_scale() -> None:
    """Gradients of ~1e-6 (a loss scaled down) give G entries ~1e-12: FP16 storage must still precondition."""
    grads = {}
    for dtype in (None, torch.float16):
        torch.manual_seed(0)
        model = TinyTransformerish()
        precond = KFACPreconditioner(model, kl_clip=None, damping=1e-13, factor_dtype=dtype)
        ids, target = torch.randint(0, 11, (8, 5)), torch.randn(8, 5, 5)
        (F.mse_loss(model(ids), target) * 1e-6).backward()
        precond.step()
        grads[dtype] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert torch.isfinite(grads[torch.float16]).all()
    err = (grads[torch.float16] - grads[None]).norm() / grads[None].norm()
    assert err < 0.05, f"FP16-stored factors precondition {err:.3f} away from FP32 ones"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_export_restore_round_trip_keeps_storage(dtype: torch.dtype) -> None:
    f = KroneckerFactor("g", 8, diagonal=False, storage_dtype=dtype, scale_by_passes=False)
    f.commit(_realistic_g(8, 1e-9, 0), 0.5)
    saved = f.export()
    assert isinstance(saved["value"], torch.Tensor) and saved["value"].dtype == dtype
    g = KroneckerFactor("g", 8, diagonal=False, storage_dtype=dtype, scale_by_passes=False)
    g.restore(saved, torch.device("cpu"))
    assert g.updates == 1
    torch.testing.assert_close(g.value, f.value, rtol=0, atol=0)


@pytest.mark.parametrize("same_object", [True, False])
def test_a_factor_counts_a_batch_fed_again_as_the_same_tensor(same_object: bool) -> None:
    """Feeding the very same ``ids`` tensor object on the next step (a fixed benchmark batch) is a new pass: the
    embedding's A factor must update exactly as with an equal copy. The shared-A guard once compared tensor identity
    across passes and silently dropped every later statistic of that layer."""
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, kl_clip=None, factor_decay=0.5, skip_layers=[], **EVERY_STEP)
    ids = torch.randint(0, 11, (8, 5), generator=torch.Generator().manual_seed(5))
    target = torch.zeros(8, 5, 5)
    snapshots = []
    for step in range(2):
        batch = ids if same_object or step == 0 else ids.clone()
        F.mse_loss(model(batch), target).backward()
        precond.step()
        model.zero_grad()
        snapshots.append({name: layer.a_factor.float().clone() for name, layer in precond.layers.items()})
    emb = next(name for name, layer in precond.layers.items() if layer.a.diagonal)
    # same ids both steps: with decay 0.5 the running average stays the per-step statistic, whatever the weights
    torch.testing.assert_close(snapshots[1][emb], snapshots[0][emb])
    assert precond.layers[emb].a.updates == 2


# Half-precision windows (kaisa_ds.factors.window): each pass rounds the window sum once to the storage dtype
# (unit roundoff u = 2^-11 FP16, 2^-8 BF16) relative to the window's bound, and the stored average once more.
# Documented tolerances, relative to each factor's largest entry: FP16 4 passes 4e-3, BF16 3e-2.
HALF_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _close_to_peak(got: torch.Tensor, want: torch.Tensor, tol: float, key: str) -> None:
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    assert err <= tol, f"{key}: {err:.2e} of the largest entry (tolerance {tol:.0e})"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("passes", "scale"), [(4, 1.0), (2, 65536.0), (1, 1e-4)])
def test_half_windows_keep_the_pass_and_loss_scale_invariance(dtype: torch.dtype, passes: int, scale: float) -> None:
    ref = _factors_after_one_step(1)  # FP32, one pass
    got = _factors_after_one_step(passes, scale, factor_dtype=dtype)
    for key in ref:
        if key != "grad":
            _close_to_peak(got[key], ref[key], HALF_TOL[dtype], key)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_window_is_a_packed_half_triangle_however_many_passes(dtype: torch.dtype) -> None:
    f = KroneckerFactor("g", 16, diagonal=False, storage_dtype=dtype, scale_by_passes=False)
    for _ in range(20):
        f.add(_realistic_g(16, 1e-9, 0), 4)
        assert f.nbytes() == 16 * 17 // 2 * 2  # no FP32 copy, no full square
    assert f.window_packed


@pytest.mark.parametrize("magnitude", [1e-12, 1e6])
def test_fp16_window_neither_underflows_nor_overflows_over_many_passes(magnitude: float) -> None:
    """G sums of 1e-12 are below FP16's range, 200 passes of 1e6 far above it: the scaled window holds both."""
    f = KroneckerFactor("g", 24, diagonal=False, storage_dtype=torch.float16, scale_by_passes=False)
    stats = [_realistic_g(24, magnitude * (1 + i % 7), i) for i in range(200)]
    for s in stats:
        f.add(s.clone(), 2)
    got, want = f.window_mean(), sum(stats) / 400
    assert got is not None and torch.isfinite(got).all()
    _close_to_peak(got, want, 200 * 2**-11 / 4, "window")  # k·u·B bound, B ≈ 4x the mean's peak here
