"""The warm-started eigenbasis refresh against exact eigendecompositions: first an eigh, a basis still right is kept,
a drifted factor is refreshed to the exact preconditioner's direction, a basis far off falls back to eigh, and a
batch mixes all three."""

from __future__ import annotations

import torch

from kaisa_ds.damping import Damping
from kaisa_ds.decomposition.decompose import decompose_all
from kaisa_ds.decomposition.refresh import RefreshMethod
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import DampingMode

RELATIVE = Damping(DampingMode.RELATIVE, 10.0)  # the grafted default


def _power_law(n: int, seed: int) -> torch.Tensor:
    """A factor with a power-law spectrum (as BERT's A and G have) and a random basis."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    lam = torch.arange(1, n + 1, dtype=torch.float64) ** -1.5
    return ((q * lam) @ q.t()).float()


def _drift(f: torch.Tensor, updates: int, seed: int, decay: float = 0.95) -> torch.Tensor:
    """``updates`` running-average updates with new statistics of the same kind (a new random basis each)."""
    for i in range(updates):
        f = decay * f + (1 - decay) * _power_law(f.shape[0], seed + i)
    return f


def _damped_inverse(dec: Decomposition, damping: float, v: torch.Tensor) -> torch.Tensor:
    q, lam = dec.eigvecs.double(), dec.eigvals.double()  # type: ignore[union-attr]
    return q @ ((q.t() @ v) / (lam + damping))


def _cosine_to_exact(dec: Decomposition, f: torch.Tensor) -> float:
    """Cosine between (F + γI)⁻¹ v through ``dec`` and through FP64 eigh, γ the refresh's own per-factor shift."""
    gamma = 10.0**0.5 * float(f.diagonal().mean())
    vals, vecs = torch.linalg.eigh(f.double())
    v = torch.randn(f.shape[0], generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    exact = vecs @ ((vecs.t() @ v) / (vals.clamp(min=0) + gamma))
    return float(torch.nn.functional.cosine_similarity(_damped_inverse(dec, gamma, v), exact, dim=0))


def test_the_first_decomposition_is_exact_and_an_unchanged_factor_keeps_its_basis() -> None:
    method = RefreshMethod(keep=0.01)  # the default never keeps a basis untouched; this one keeps a right one
    f = _power_law(32, 0)
    first = method.compute(f, diagonal=False, damping=RELATIVE, dtype=torch.float32)
    assert (method.last.exact, method.last.kept) == (1, 0)
    method.start_round()
    again = method.compute(f, diagonal=False, damping=RELATIVE, dtype=torch.float32, previous=first)
    assert (method.last.kept, method.last.refreshed, method.last.exact) == (1, 0, 0)
    assert torch.equal(again.eigvecs, first.eigvecs)  # type: ignore[arg-type]
    assert _cosine_to_exact(again, f) > 0.9999
    method = RefreshMethod()  # the defaults: refreshed, and still the exact preconditioner
    method.compute(f, diagonal=False, damping=RELATIVE, dtype=torch.float32)
    method.start_round()
    refreshed = method.compute(f, diagonal=False, damping=RELATIVE, dtype=torch.float32, previous=first)
    assert method.last.refreshed == 1 and _cosine_to_exact(refreshed, f) > 0.9999


def test_a_drifted_factor_is_refreshed_to_the_exact_preconditioner() -> None:
    method = RefreshMethod()
    for seed in range(4):
        f0 = _power_law(64, 10 * seed)
        old = method.compute(f0, diagonal=False, damping=RELATIVE, dtype=torch.float32)
        stale = _cosine_to_exact(old, _drift(f0, 5, 100 + seed))
        method.start_round()
        f = _drift(f0, 5, 100 + seed)
        new = method.compute(f, diagonal=False, damping=RELATIVE, dtype=torch.float32, previous=old)
        assert method.last.refreshed == 1, method.last
        assert _cosine_to_exact(new, f) > max(0.995, stale), (seed, stale)
        assert method.last.audit_cosine is not None and method.last.audit_cosine > 0.995
        q = new.eigvecs
        torch.testing.assert_close(q.t() @ q, torch.eye(64), atol=1e-5, rtol=0)  # type: ignore[union-attr]


def test_a_basis_the_refresh_cannot_fix_falls_back_to_eigh() -> None:
    """An unrelated factor at a tiny damping: two refresh steps leave its small eigenvalues' directions wrong, the
    off-diagonal test sees it, and the factor is decomposed exactly."""
    tiny = Damping(DampingMode.ABSOLUTE, 1e-6)
    method = RefreshMethod(keep=0.01, exact_above=0.05)
    old = method.compute(_power_law(48, 1), diagonal=False, damping=tiny, dtype=torch.float32)
    other = _power_law(48, 2)
    method.start_round()
    new = method.compute(other, diagonal=False, damping=tiny, dtype=torch.float32, previous=old)
    assert method.last.exact == 1, method.last
    vals = torch.linalg.eigvalsh(other.double())
    torch.testing.assert_close(new.eigvals.double(), vals.clamp(min=0), atol=1e-5, rtol=1e-4)  # type: ignore


def test_a_batch_decides_per_factor_as_single_calls_do() -> None:
    """One batched call over a kept, a drifted and an unrelated factor gives what three single calls give."""
    f0 = {f"f{i}": _power_law(40, i) for i in range(3)}
    now = {"f0": f0["f0"], "f1": _drift(f0["f1"], 3, 50), "f2": _power_law(40, 99)}
    method = RefreshMethod(keep=0.01)  # keeps f0's basis, which is still exact
    first = decompose_all({n: (f, False) for n, f in f0.items()}, method=method, damping=RELATIVE,
                          compute_dtype=torch.float32, out_dtype=torch.float32)
    previous = {n: d for n, d in first.items() if d is not None}
    batched = decompose_all({n: (f, False) for n, f in now.items()}, method=method, damping=RELATIVE,
                            compute_dtype=torch.float32, out_dtype=torch.float32, previous=previous)
    report = method.report()
    assert report["kept"] == 1 and report["kept"] + report["refreshed"] + report["exact"] == 3
    for name, f in now.items():
        single = RefreshMethod(keep=0.01).compute(f, diagonal=False, damping=RELATIVE, dtype=torch.float32,
                                         previous=previous[name])
        got = batched[name]
        assert got is not None and got.eigvecs is not None and single.eigvecs is not None
        torch.testing.assert_close(got.eigvecs, single.eigvecs, atol=1e-5, rtol=1e-4)
        assert _cosine_to_exact(got, f) > 0.99, name
    assert torch.equal(previous["f0"].eigvecs, batched["f0"].eigvecs)  # type: ignore[union-attr, arg-type]
