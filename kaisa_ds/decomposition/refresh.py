"""Warm-started eigenbasis refresh: an exact ``eigh`` once, then a cheap update of the eigenbasis in force.

Between two decompositions a factor moves a little (a running average with decay 0.95 over a few updates), so its
eigenbasis ``Q`` of the last decomposition is nearly right. Per factor, batched by size:

1. ``W = F Q`` and ``M = Qᵀ W``: ``F`` in the old basis, whose diagonal ``d`` estimates the eigenvalues.
2. The damping-weighted off-diagonal mass ``ε = ‖offdiag(M) / √((d_i + γ)(d_j + γ))‖_F`` says how wrong the old
   basis is *where it matters*: ``(M + γI)⁻¹`` differs from its diagonal approximation by about ``ε`` relative, and
   directions the damping ``γ`` outweighs count little (an unweighted test misses stale damped directions).
3. ``ε ≤`` :data:`KEEP`: the basis stays and only the eigenvalues ``d`` are updated. Else steps of subspace
   iteration, as SOAP (Vyas et al. 2024) and Distributed Shampoo's QR eigendecomposition refresh do: the columns of
   ``W`` sorted by ``d`` descending (an ascending order ruins it), orthonormalised by QR, ``d = diag(Qᵀ F Q)``;
   more steps while ``ε`` is above :data:`KEEP`, up to :data:`STEPS`, and an exact ``eigh`` for a factor still above
   :data:`EIGH` after them (or with no basis yet: the first decomposition, a fallback). The defaults (never keep,
   4 steps) were chosen on a BERT-mini run's factors: with 50 steps between decompositions BERT's factors move far
   (a stale basis: median cosine 0.95, minimum 0.22), and fewer steps left the worst layers below 0.98.

The per-factor shift ``γ`` is the one the inverse method adds to each factor (:func:`kaisa_ds.damping.factor_shift`:
``√r · mean(d)`` for relative damping). On a GPU a refresh is a few tensor-core matmuls and a QR where ``eigh`` is a
long chain of small kernels; on a CPU it is not faster than ``eigh`` (1024²: about 300 against 200 ms).
:attr:`RefreshMethod.last` counts what the last call did per factor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kaisa_ds.damping import Damping, factor_shift
from kaisa_ds.decomposition.eigen import EigenMethod, exact_eigh
from kaisa_ds.decomposition.method import Rates, scaled
from kaisa_ds.decomposition.scaling import EigenScaling
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import ComputeMethod

# chosen by rule 8 (benchmarks/results/convergence/defaults_rule_8.md) from benchmarks/results/refresh_accuracy.json,
# BERT-mini's own factors over 1000 steps: 4 steps, never keeping a basis untouched, gave the highest minimum cosine
# to FP64 eigh (0.9885, median 0.9996); keeping bases whose ε was small (0.01, 0.05) let the worst layers fall to
# 0.70-0.96, and 2 steps to 0.94
KEEP = 0.0  # ε at or below this: the basis in force is kept, only the eigenvalues are updated
EIGH = 0.2  # ε still above this after STEPS refresh steps: an exact eigh
STEPS = 4
REFRESH_GEMMS = 6  # n³ multiply-adds per refresh step: F Q, Qᵀ W, a QR (~2-4), for the planner's cost model


@dataclass
class RefreshCounts:
    """What one decomposition call did, per factor."""

    kept: int = 0
    refreshed: int = 0  # one or more subspace steps
    exact: int = 0  # eigh: no basis yet, or the refresh did not converge
    audit_cosine: float | None = None  # the lowest audit of this call (see RefreshMethod.audit)

    def add(self, other: RefreshCounts) -> None:
        self.kept, self.refreshed, self.exact = (self.kept + other.kept, self.refreshed + other.refreshed,
                                                 self.exact + other.exact)
        if other.audit_cosine is not None:
            self.audit_cosine = min(other.audit_cosine, self.audit_cosine or 1.0)


def in_basis(f: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W, M) = (F Q, Qᵀ F Q)`` for a batch ``(L, n, n)``."""
    w = f @ q
    return w, q.transpose(-2, -1) @ w


def off_diagonal_error(m: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``ε`` per factor: the off-diagonal share of ``M`` scaled by the damped diagonal, ``S = D^-½ M D^-½`` with
    ``D = diag(M) + γ`` (``gamma``: ``(L, 1)``), ``‖offdiag(S)‖_F / ‖S‖_F``: Distributed Shampoo's relative test,
    weighted so that a stale direction the damping outweighs still counts."""
    d = m.diagonal(dim1=-2, dim2=-1).clamp(min=0.0) + gamma
    scaled_m = m / torch.sqrt(d.unsqueeze(-1) * d.unsqueeze(-2))
    off = scaled_m - torch.diag_embed(scaled_m.diagonal(dim1=-2, dim2=-1))
    return off.flatten(1).norm(dim=1) / scaled_m.flatten(1).norm(dim=1).clamp_min(1e-30)


def subspace_step(f: torch.Tensor, w: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """One step of subspace iteration from ``W = F Q``: columns sorted by the eigenvalue estimates, descending,
    then orthonormalised (the new Q)."""
    order = m.diagonal(dim1=-2, dim2=-1).argsort(dim=-1, descending=True)
    w = w.gather(-1, order.unsqueeze(-2).expand_as(w))
    q, r = torch.linalg.qr(w)
    return q * torch.sign(r.diagonal(dim1=-2, dim2=-1)).unsqueeze(-2)  # a positive diagonal of R: no sign flips


def damped_inverse_cosine(ours: tuple[torch.Tensor, torch.Tensor], exact: tuple[torch.Tensor, torch.Tensor],
                          gamma: torch.Tensor) -> float:
    """The cosine between ``(F + γ)⁻¹ v`` through two eigendecompositions ``(Q, λ)`` of one factor, for a fixed
    probe ``v`` (the audit's figure: 1 when the refreshed basis preconditions as the exact one)."""
    probe = torch.randn(ours[0].shape[-1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = []
    for q, lam in (ours, exact):
        q64 = q.double().cpu()
        out.append(q64 @ ((q64.t() @ probe) / (lam.double().cpu().clamp(min=0) + float(gamma))))
    return float(torch.nn.functional.cosine_similarity(out[0], out[1], dim=0))


class RefreshMethod(EigenMethod):
    """An eigenbasis method (applied as :class:`~kaisa_ds.decomposition.eigen.EigenMethod`) that updates the basis
    in force instead of decomposing from scratch. Each batched call audits one refreshed factor (a different one
    each time) against an exact eigh, reported as ``audit_cosine``."""

    kind = ComputeMethod.EIGEN_REFRESH

    def __init__(self, *, keep: float = KEEP, exact_above: float = EIGH, steps: int = STEPS,
                 scaling: EigenScaling | None = None) -> None:
        super().__init__(scaling=scaling)
        self.keep, self.exact_above, self.steps = keep, exact_above, steps
        self.last = RefreshCounts()
        self.total = RefreshCounts()
        self._audits = 0

    def start_round(self) -> None:
        self.last = RefreshCounts()

    def report(self) -> dict[str, float]:
        out: dict[str, float] = {"kept": self.last.kept, "refreshed": self.last.refreshed, "exact": self.last.exact}
        if self.last.audit_cosine is not None:
            out["audit_cosine"] = self.last.audit_cosine
        return out

    def compute(self, factors: torch.Tensor, *, diagonal: bool, damping: Damping, dtype: torch.dtype,
                previous: Decomposition | None = None) -> Decomposition:
        if diagonal:
            return super().compute(factors, diagonal=True, damping=damping, dtype=dtype)
        single = factors.dim() == 2
        f = factors.to(dtype).unsqueeze(0) if single else factors.to(dtype)
        if previous is None or previous.eigvecs is None:
            dec = exact_eigh(f, dtype)
            counts = RefreshCounts(exact=f.shape[0])
        else:
            q = previous.eigvecs.to(dtype, copy=True)  # written in place below; the basis in force stays intact
            dec, counts = self._refresh(f, q.unsqueeze(0) if single else q, damping)
        self.last.add(counts)
        self.total.add(counts)
        if single:
            assert dec.eigvecs is not None and dec.eigvals is not None
            return Decomposition(eigvecs=dec.eigvecs[0], eigvals=dec.eigvals[0])
        return dec

    def _refresh(self, f: torch.Tensor, q: torch.Tensor, damping: Damping) -> tuple[Decomposition, RefreshCounts]:
        shift = factor_shift(damping, f, diagonal=False)  # (L, 1, 1) relative, a number absolute
        gamma = torch.as_tensor(shift, dtype=f.dtype, device=f.device).reshape(-1, 1).expand(f.shape[0], 1)
        w, m = in_basis(f, q)
        err = off_diagonal_error(m, gamma)
        kept = err <= self.keep
        counts = RefreshCounts(kept=int(kept.sum()))  # one host sync: decomposition steps sync anyway
        todo = (~kept).nonzero().flatten()
        for _ in range(self.steps):
            if todo.numel() == 0:
                break
            q_new = subspace_step(f[todo], w[todo], m[todo])
            w_new, m_new = in_basis(f[todo], q_new)
            q[todo], w[todo], m[todo] = q_new, w_new, m_new
            err_new = off_diagonal_error(m_new, gamma[todo])
            err[todo] = err_new
            todo = todo[err_new > self.keep]
        bad = (err > self.exact_above).nonzero().flatten()
        lam = m.diagonal(dim1=-2, dim2=-1).clone()
        if bad.numel():
            exact = exact_eigh(f[bad], f.dtype)
            assert exact.eigvecs is not None and exact.eigvals is not None
            q[bad], lam[bad] = exact.eigvecs, exact.eigvals
        counts.exact = int(bad.numel())
        counts.refreshed = f.shape[0] - counts.kept - counts.exact
        lam = lam.clamp(min=0.0)
        exact_ok = set(bad.tolist())
        audited = [i for i in range(f.shape[0]) if i not in exact_ok]
        if audited:
            i = audited[self._audits % len(audited)]
            self._audits += 1
            ref = exact_eigh(f[i], f.dtype)
            assert ref.eigvecs is not None and ref.eigvals is not None
            counts.audit_cosine = damped_inverse_cosine((q[i], lam[i]), (ref.eigvecs, ref.eigvals), gamma[i, 0])
        return Decomposition(eigvecs=q, eigvals=lam), counts

    def seconds(self, n: int, *, rates: Rates) -> float:
        """A refresh step's matmuls at the GEMM rate (the first decomposition and fallbacks are eigh's)."""
        return REFRESH_GEMMS * 2 * n**3 / (rates.gemm_gflops * 1e9) if rates.gemm_gflops else scaled(
            rates.eigh_seconds, n, flag=self.rate_flag)
