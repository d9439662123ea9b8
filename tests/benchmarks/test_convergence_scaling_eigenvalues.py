"""Amendment 8's rule: the adaptive eigenvalues become the default only if their mean gap to LAMB over the cells is
0.05 nats below the defaults' and no cell stays on the plateau where the defaults leave it; the committed choice is
rebuilt from the committed records."""

from __future__ import annotations

import pytest

from benchmarks.convergence.scaling_eigenvalues import decide, eigenvalue_study
from benchmarks.convergence.scaling_rate import both_models_cells
from tests.support.records import committed_choice


def _cells(**finals: tuple[float, float]) -> dict:
    return {name: {"lamb": 3.0, "early": 5.5, "defaults": d, "candidate": c} for name, (d, c) in finals.items()}


def test_the_mean_gap_must_drop_by_the_margin() -> None:
    assert decide(_cells(a=(3.2, 3.1), b=(3.0, 3.0)))[0] is True  # mean 0.10 -> 0.05: down by 0.05
    assert decide(_cells(a=(3.2, 3.14), b=(3.0, 3.0)))[0] is False  # down by 0.03
    chosen, why = decide(_cells(a=(3.2, 3.2), b=(3.0, 3.04)))
    assert not chosen and "not 0.05 nats below" in why


def test_a_cell_left_on_the_plateau_vetoes_whatever_the_mean() -> None:
    chosen, why = decide(_cells(a=(5.0, 5.7), b=(5.8, 3.0)))  # mean far better, but a stays on the plateau
    assert not chosen and "['a']" in why
    assert decide(_cells(a=(5.8, 5.7), b=(5.8, 3.0)))[0] is True  # both on the plateau at a: no veto


def test_the_committed_choice_follows_from_the_committed_records() -> None:
    root, committed = committed_choice("scaling_eigenvalues.json", what="amendment 8's cells")
    rebuilt = eigenvalue_study(both_models_cells(root))
    assert rebuilt["chosen"] == committed["chosen"]
    assert rebuilt["mean_gap"] == pytest.approx(committed["mean_gap"])
