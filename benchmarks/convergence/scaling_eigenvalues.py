"""Amendment 8's choice of the eigenvalue scaling (docs/studies/batch_scaling.md): ``{"enabled": true,
"eigenvalues": "adaptive"}`` against today's defaults, once, over amendment 7's six tune-part cells.

A cell's gap is a probe's final held-out loss minus LAMB's chosen final at that cell (tune part, seed 0, LAMB's
rate). The candidate becomes the default if its mean gap is at least :data:`MARGIN` nats below the defaults' and no
cell ends on the unigram plateau (above the early target) where the defaults do not. The defaults' probes are
amendment 7's ``c`` = 1 records. Timing plays no part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.convergence.scaling import RULE, recorded_plateau
from benchmarks.convergence.scaling_rate import Cell, lamb_chosen, probe_final

CANDIDATE = {"eigenvalues": "adaptive"}
MARGIN = 0.05  # nats: the candidate's mean gap must be at least this much lower
RULE_TEXT = ("the candidate's mean gap to LAMB's chosen final over the cells is >= 0.05 nats below the defaults' and "
             "no cell ends above the early target where the defaults do not (docs/studies/batch_scaling.md, "
             "amendment 8)")


def early_target(cell: Cell, *, lamb_lr: float) -> float:
    """The plateau minus the rule's first drop, from the plateau recorded for the cell's tune part (plateaus.json,
    keyed by the data cache LAMB's chosen tune run was evaluated with)."""
    record = json.loads((cell.results / f"b{cell.tokens}" / "tune" / f"lamb_lr{lamb_lr:g}.json").read_text())
    return recorded_plateau(cell.results, record, "tune", examples=RULE.eval_examples) - RULE.target_drops[0]


def mean_gaps(cells: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The defaults' and the candidate's mean final minus LAMB's chosen final over the cells."""
    return {k: sum(c[k] - c["lamb"] for c in cells.values()) / len(cells) for k in ("defaults", "candidate")}


def stuck_cells(cells: dict[str, dict[str, Any]]) -> list[str]:
    """The cells where the candidate ends on the plateau (above the early target) and the defaults do not."""
    return sorted(n for n, c in cells.items() if c["candidate"] > c["early"] >= c["defaults"])


def decide(cells: dict[str, dict[str, Any]], *, margin: float = MARGIN) -> tuple[bool, str]:
    """Whether the candidate is chosen, and why, from each cell's finals (``defaults``, ``candidate``, ``lamb``,
    ``early``)."""
    gap, stuck = mean_gaps(cells), stuck_cells(cells)
    if stuck:
        return False, f"the candidate stays on the plateau where the defaults leave it: {stuck}"
    if gap["defaults"] - gap["candidate"] < margin:
        return False, (f"its mean gap {gap['candidate']:+.3f} is not {margin} nats below the defaults' "
                       f"{gap['defaults']:+.3f}")
    return True, f"its mean gap {gap['candidate']:+.3f} against the defaults' {gap['defaults']:+.3f}"


def cell_rows(cells: list[Cell], *, defaults: dict[str, Any], candidate: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per cell: LAMB's chosen rate and final, the early target, the finals of the probes of ``defaults`` and of
    ``candidate`` (their ``--kfac-set`` keys), and those probes' records."""
    rows: dict[str, dict[str, Any]] = {}
    for cell in cells:
        lr, lamb_final = lamb_chosen(cell)
        rows[cell.name] = {"lamb_lr": lr, "lamb": lamb_final, "early": early_target(cell, lamb_lr=lr),
                           "defaults": probe_final(cell, 1.0, lamb_lr=lr, kfac=defaults),
                           "candidate": probe_final(cell, 1.0, lamb_lr=lr, kfac=candidate),
                           "records": [str(cell.probe_path(1.0, k).relative_to(cell.results.parent))
                                       for k in (defaults, candidate)]}
    return rows


def eigenvalue_study(cells: list[Cell]) -> dict[str, Any]:
    """Every cell's finals and gaps, the means and the decision, as ``scaling_eigenvalues.json`` keeps them."""
    rows = cell_rows(cells, defaults={}, candidate=CANDIDATE)
    chosen, why = decide(rows)
    return {"rule": RULE_TEXT, "candidate": CANDIDATE, "cells": rows, "mean_gap": mean_gaps(rows), "chosen": chosen,
            "why": why}


def gap_bars(ax: Any, result: dict[str, Any], *, labels: dict[str, str]) -> None:
    """Each cell's gap to LAMB's chosen final under the defaults and under a candidate, side by side, on ``ax``
    (``labels``: ``defaults`` and ``candidate`` as the legend names them)."""
    names = list(result["cells"])
    for i, key in enumerate(("defaults", "candidate")):
        gaps = [result["cells"][n][key] - result["cells"][n]["lamb"] for n in names]
        ax.bar([j + (i - 0.5) * 0.38 for j in range(len(names))], gaps, width=0.38,
               label=f"{labels[key]}: mean {result['mean_gap'][key]:+.2f}")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("K-FAC's final - LAMB's final (nats, tune part)")
    ax.legend(fontsize=8)


def plot_eigenvalues(result: dict[str, Any], path: Path) -> Path:
    """Each cell's gap to LAMB under the defaults and under the candidate, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    gap_bars(ax, result, labels={"defaults": "kronecker (today's defaults)", "candidate": "adaptive (amendment 8)"})
    ax.set_title(f"Amendment 8: {'adaptive chosen' if result['chosen'] else 'defaults kept'} (below 0: K-FAC better)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
