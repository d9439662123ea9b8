"""Amendment 9's choice of one-sided rotation (docs/studies/batch_scaling.md): ``{"enabled": true,
"max_factor_ratio": 2}`` against today's defaults, once, over amendment 7's six tune-part cells and one cost run
each.

A cell's gap is a probe's final held-out loss minus LAMB's chosen final at that cell (tune part, seed 0, LAMB's
rate); today's defaults in the cells are amendment 8's adaptive probes. The candidate is chosen if its mean gap is at
most :data:`NON_INFERIORITY` nats above the defaults', no cell ends on the unigram plateau where the defaults leave
it, and its per-step overhead (``benchmarks.default_overhead`` at BERT-mini's 2,048 tokens, each run against its own
side-by-side LAMB baseline) is at most :data:`COST_SHARE` of the defaults'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.convergence.scaling_eigenvalues import cell_rows, gap_bars, mean_gaps, stuck_cells
from benchmarks.convergence.scaling_rate import Cell

CANDIDATE = {"max_factor_ratio": 2}
DEFAULTS = {"eigenvalues": "adaptive"}  # amendment 8's probes: today's defaults, set explicitly before they were
NON_INFERIORITY = 0.05  # nats: the candidate's mean gap may be at most this much higher
COST_SHARE = 2 / 3  # the candidate's overhead at most this share of the defaults'
COST_SETTINGS = {"size": "mini", "batch": 32, "seq": 64, "optimizer": "lamb", "steps": 150, "device": "cpu"}
COST_RUNS = {"defaults": "overhead_defaults.json", "candidate": "overhead_candidate.json"}
RULE_TEXT = ("the candidate's mean gap to LAMB's chosen final over the cells is at most 0.05 nats above the "
             "defaults', no cell ends above the early target where the defaults do not, and its per-step overhead "
             "at BERT-mini 2,048 tokens is at most 2/3 of the defaults' (docs/studies/batch_scaling.md, amendment 9)")


def read_overhead(path: Path, *, kfac: dict[str, Any]) -> float:
    """The K-FAC copy's overhead over its baseline, after checking the run is the one the rule names."""
    if not path.is_file():
        keys = " --kfac-set " + " ".join(f"{k}={v}" for k, v in kfac.items()) if kfac else ""
        raise SystemExit(f"{path} is missing: run python -m benchmarks.default_overhead --size mini --batch 32 "
                         f"--seq 64 --optimizer lamb --steps 150{keys} --out {path}")
    record = json.loads(path.read_text())
    settings = record["settings"]
    wrong = {k: settings.get(k) for k, want in COST_SETTINGS.items() if settings.get(k) != want}
    if dict(settings.get("kfac_set") or []) != kfac:
        wrong["kfac_set"] = settings.get("kfac_set")
    if wrong:
        raise SystemExit(f"{path}: not the rule's cost run ({COST_SETTINGS}, --kfac-set {kfac}): {wrong}")
    return float(record["overhead"])


def decide(cells: dict[str, dict[str, Any]], overhead: dict[str, float], *, margin: float = NON_INFERIORITY,
           share: float = COST_SHARE) -> tuple[bool, str]:
    """Whether the candidate is chosen, and why, from each cell's finals (``defaults``, ``candidate``, ``lamb``,
    ``early``) and both overheads."""
    gap, stuck = mean_gaps(cells), stuck_cells(cells)
    if stuck:
        return False, f"the candidate stays on the plateau where the defaults leave it: {stuck}"
    if gap["candidate"] - gap["defaults"] > margin:
        return False, (f"its mean gap {gap['candidate']:+.3f} is more than {margin} nats above the defaults' "
                       f"{gap['defaults']:+.3f}")
    if overhead["candidate"] > share * overhead["defaults"]:
        return False, (f"its overhead {overhead['candidate']:.1%} is over {share:.2f} of the defaults' "
                       f"{overhead['defaults']:.1%}")
    return True, (f"its mean gap {gap['candidate']:+.3f} against the defaults' {gap['defaults']:+.3f}, its overhead "
                  f"{overhead['candidate']:.1%} against {overhead['defaults']:.1%}")


def one_sided_study(cells: list[Cell], *, cost_folder: Path) -> dict[str, Any]:
    """Every cell's finals and gaps, both overheads, the means and the decision, as ``scaling_one_sided.json``
    keeps them."""
    rows = cell_rows(cells, defaults=DEFAULTS, candidate=CANDIDATE)
    overhead = {k: read_overhead(cost_folder / name, kfac=CANDIDATE if k == "candidate" else {})
                for k, name in COST_RUNS.items()}
    chosen, why = decide(rows, overhead)
    return {"rule": RULE_TEXT, "candidate": CANDIDATE, "cells": rows, "mean_gap": mean_gaps(rows), "overhead": overhead,
            "cost_records": {k: str((cost_folder / n).relative_to(cost_folder.parent)) for k, n in COST_RUNS.items()},
            "chosen": chosen, "why": why}


def plot_one_sided(result: dict[str, Any], path: Path) -> Path:
    """Each cell's gap to LAMB under the defaults and the candidate, and both per-step overheads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (gaps, cost) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 1]})
    gap_bars(gaps, result, labels={"defaults": "both sides (today's defaults)",
                                   "candidate": "one-sided, max_factor_ratio 2"})
    gaps.set_title("final loss against LAMB's (below 0: K-FAC better)")
    keys = ("defaults", "candidate")
    cost.bar(range(2), [100 * result["overhead"][k] for k in keys], color=["C0", "C1"])
    cost.set_xticks(range(2), ["defaults", "one-sided"])
    cost.set_ylabel("K-FAC's step over LAMB's (%)")
    cost.set_title("BERT-mini, 2,048 tokens")
    fig.suptitle(f"Amendment 9: {'one-sided chosen' if result['chosen'] else 'defaults kept'}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
