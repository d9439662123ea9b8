"""Decompositions run in FP32/FP64 whatever the storage dtype, and are stored in inv_dtype."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds.decomposition.decompose import decompose, decompose_all
from kaisa_ds.decomposition.inverse import spd_inverse
from kaisa_ds.enums import ComputeMethod


def _spd(n: int) -> torch.Tensor:
    x = torch.randn(3 * n, n, generator=torch.Generator().manual_seed(n))
    return x.t() @ x / (3 * n)


@pytest.mark.parametrize("storage", [torch.float16, torch.bfloat16, torch.float32])
def test_eigen_reconstructs_factor_from_half_storage(storage: torch.dtype) -> None:
    f = _spd(12).to(storage)
    dec = decompose(f, method=ComputeMethod.EIGEN, diagonal=False, damping=0.0, compute_dtype=torch.float32,
                    out_dtype=torch.float32)
    assert dec is not None and dec.eigvecs is not None and dec.eigvals is not None
    assert dec.eigvecs.dtype == torch.float32 and (dec.eigvals >= 0).all()
    rebuilt = dec.eigvecs @ torch.diag(dec.eigvals) @ dec.eigvecs.t()
    torch.testing.assert_close(rebuilt, f.float(), rtol=1e-4, atol=1e-4)


def test_inverse_is_damped_inverse_and_diagonal_is_elementwise() -> None:
    f = _spd(6)
    dec = decompose(f, method=ComputeMethod.INVERSE, diagonal=False, damping=0.1, compute_dtype=torch.float64,
                    out_dtype=torch.bfloat16)
    assert dec is not None and dec.inverse is not None and dec.inverse.dtype == torch.bfloat16
    torch.testing.assert_close(dec.inverse.double() @ (f.double() + 0.1 * torch.eye(6, dtype=torch.float64)),
                               torch.eye(6, dtype=torch.float64), rtol=0, atol=3e-2)
    d = decompose(torch.tensor([1.0, 3.0]), method=ComputeMethod.INVERSE, diagonal=True, damping=1.0,
                  compute_dtype=torch.float32, out_dtype=torch.float32)
    assert d is not None and torch.equal(d.inverse, torch.tensor([0.5, 0.25]))


def test_non_finite_factor_returns_none() -> None:
    f = _spd(4)
    f[0, 0] = float("nan")
    assert decompose(f, method=ComputeMethod.EIGEN, diagonal=False, damping=0.1, compute_dtype=torch.float32,
                     out_dtype=torch.float32) is None


def test_batched_inverse_is_symmetric_and_inverts_each_damped_factor() -> None:
    factors = {f"f{i}": (_spd(16) * (i + 1), False) for i in range(3)}
    decs = decompose_all(factors, method=ComputeMethod.INVERSE, damping=1e-3, compute_dtype=torch.float32,
                         out_dtype=torch.float32)
    for name, (f, _) in factors.items():
        inv = decs[name]
        assert inv is not None and inv.inverse is not None
        assert torch.equal(inv.inverse, inv.inverse.t())  # Cholesky's inverse is exactly symmetric
        torch.testing.assert_close(inv.inverse @ (f + 1e-3 * torch.eye(16)), torch.eye(16), rtol=0, atol=1e-3)


def _rounded_gram(n: int = 96, rows: int = 4096) -> torch.Tensor:
    """A factor as K-FAC stores it: the Gram matrix of LayerNorm-like inputs with a bias column (one dominant
    eigenvalue, most far below it), rounded to FP16 storage, which leaves eigenvalues a little below zero."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, n - 1, generator=g) @ torch.randn(n - 1, n - 1, generator=g).tril() * 0.3 + 0.5
    x = torch.cat([x, torch.ones(rows, 1)], dim=1)
    return (x.t() @ x / rows).half()


def test_a_factor_rounded_below_its_damping_gets_a_positive_definite_inverse() -> None:
    """On an H100 at BERT-Large the inverse method's LU fallback made the preconditioner indefinite: the gradient
    pointed away from itself in up to 17 of 144 layers (call 7, 2026-11-27)."""
    f, damping = _rounded_gram(), 1e-5
    assert float(torch.linalg.eigvalsh(f.double()).min()) < -damping  # the case: F + γI is indefinite
    dec = decompose(f, method=ComputeMethod.INVERSE, diagonal=False, damping=damping, compute_dtype=torch.float32,
                    out_dtype=torch.float32)
    assert dec is not None and dec.inverse is not None
    assert float(torch.linalg.eigvalsh(dec.inverse.double()).min()) > 0
    # the eigen method's clamp: Q diag(1 / (max(λ_F, 0) + γ)) Qᵀ
    vals, vecs = torch.linalg.eigh(f.double())
    expected = (vecs / (vals.clamp(min=0) + damping)) @ vecs.t()
    torch.testing.assert_close(dec.inverse.double(), expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max()))


def test_in_a_batch_only_the_indefinite_factor_leaves_cholesky(caplog: pytest.LogCaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from kaisa_ds.decomposition import inverse as module

    monkeypatch.setattr(module, "_WARNED_SIZES", set())  # once per size and process: earlier tests may have warned
    bad = torch.diag(torch.tensor([2.0, 1.0, -0.5]))  # a "factor" with an eigenvalue below -shift
    good = _spd(3)
    shift = torch.tensor([0.1, 0.2]).view(2, 1, 1)  # per-matrix shifts, as relative damping gives
    m = torch.stack([bad, good]) + shift * torch.eye(3)
    with caplog.at_level("WARNING"):
        inv = spd_inverse(m, shift=shift)
    torch.testing.assert_close(inv[0], torch.diag(1 / torch.tensor([2.1, 1.1, 0.1])))  # -0.5 clamped to 0, + 0.1
    torch.testing.assert_close(inv[1], torch.cholesky_inverse(torch.linalg.cholesky(m[1])))
    assert "1 of 2 damped 3x3 factors were not positive definite" in caplog.text
