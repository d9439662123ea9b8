"""Decompositions run in FP32/FP64 whatever the storage dtype, and are stored in inv_dtype."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds.decomposition.decompose import decompose, decompose_all, spd_inverse
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


def test_a_damped_factor_that_is_not_positive_definite_still_gets_its_inverse() -> None:
    m = torch.diag(torch.tensor([2.0, 1.0, -0.5]))  # invertible, not positive definite: Cholesky fails
    m = torch.stack([m, torch.eye(3)])  # one bad matrix in a batch falls the whole batch back to LU
    torch.testing.assert_close(spd_inverse(m), torch.linalg.inv(m))
