"""On 2 ranks, every KAISA strategy and both methods, with gradient accumulation: the default (relative) damping
leaves every preconditioned direction unchanged when the loss is multiplied by c in 1e-4..1e4, and the result
still differs from the raw gradient."""

from __future__ import annotations

from tests.kaisa_ds.precondition.test_scale_invariance import SCALES, cosines, preconditioned
from tests.support.launch import run_distributed

STRATEGIES = ("comm-opt", "hybrid-opt", "mem-opt")


def _figures(rank: int, world: int) -> dict[str, tuple[float, float]]:
    """(worst per-weight cosine over the scales, mean cosine to the raw gradient) per strategy and method."""
    out = {}
    for strategy in STRATEGIES:
        for method in ("eigen", "inverse"):
            opts = {"grad_worker_fraction": strategy, "compute_method": method, "passes": 2, "rank": rank,
                    "world": world}
            raw, base = preconditioned(1.0, **opts)  # type: ignore[arg-type]
            worst = min(min(cosines(preconditioned(c, **opts)[1], base).values())  # type: ignore[arg-type]
                        for c in SCALES)
            to_raw = cosines(base, raw)
            out[f"{strategy}/{method}"] = (worst, sum(to_raw.values()) / len(to_raw))
    return out


def test_every_strategy_on_two_ranks_ignores_the_loss_scale() -> None:
    for rank_figures in run_distributed(_figures, 2):
        for case, (worst, to_raw) in rank_figures.items():
            assert worst >= 0.999, f"{case}: worst per-weight cosine {worst:.4f}"
            assert to_raw < 0.99, f"{case}: K-FAC is the raw gradient (mean cosine {to_raw:.4f})"
