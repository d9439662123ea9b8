"""K-FAC's step split into its size and its direction, from recorded tune-part runs (issue 23, 2c).

``python -m benchmarks.convergence.size_direction --regime large`` reads the records that
``benchmarks.convergence defaults --part tune --set grafting=...`` wrote beside LAMB's tuning runs and the defaults'
(E) runs, prints each one's held-out MLM loss at a few steps and at the end, and plots them
(``<regime>/grafting_tune.png``): LAMB; E, K-FAC's direction and size; G, K-FAC's direction at the gradient's size
(``grafting: "gradient"``, no KL clip); S, the gradient's direction at K-FAC's size (``grafting: "kfac-size"``).
A variant without records for the regime is left out. Nothing is trained here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.convergence.analysis import curve_of
from benchmarks.convergence.plots import plot_curves
from benchmarks.convergence.regimes import REGIMES
from benchmarks.convergence.runner import tune_spec
from benchmarks.harness.output import table

RESULTS = Path(__file__).resolve().parents[1] / "results" / "convergence"
SEEDS = (0, 1)
# regime -> E's record stem on the tune part: the rules' records of the intervals "auto" resolves to there (rule 3)
DEFAULTS_STEMS = {"large": "defaults_tune/defaults_inv_update_steps10",
                  "small": "defaults_tune/defaults_factor_update_steps5_inv_update_steps50"}
VARIANTS = {"G: K-FAC's direction, the gradient's size (the defaults since rule 6)":
            "defaults_tune/defaults_graftinggradient_kl_clipNone",
            "S: the gradient's direction, K-FAC's size": "defaults_tune/defaults_graftingkfac-size"}
AT = {"large": (15, 60, 150, 300), "small": (50, 250, 750, 1000)}


def record_paths(regime: str, results: Path = RESULTS, *, e_stem: str | None = None) -> dict[str, list[Path]]:
    """Label -> the seeds' record paths that exist. LAMB's are its chosen tuning run's (``chosen.json``), named as
    the tuning sweep names them; E's are ``e_stem``'s (default: the study's, :data:`DEFAULTS_STEMS`)."""
    lamb = json.loads((results / regime / "chosen.json").read_text())["lamb"]
    names = [tune_spec(regime=REGIMES[regime], settings=lamb, optimizer="lamb", seed=seed).name for seed in SEEDS]
    out = {"LAMB (tuned)": [results / regime / "tune" / f"{name}.json" for name in names]}
    stems = {"E: grafting none (the defaults until rule 6), K-FAC's direction and size":
             e_stem or DEFAULTS_STEMS[regime], **VARIANTS}
    for label, stem in stems.items():
        out[label] = [results / regime / f"{stem}_seed{seed}.json" for seed in SEEDS]
    return {label: paths for label, paths in out.items() if all(p.is_file() for p in paths)}


def rows(records: dict[str, list[dict[str, Any]]], at: tuple[int, ...]) -> list[dict[str, Any]]:
    """One row per variant: the held-out loss at each step of ``at`` and at the end, seeds joined by ' / '."""
    out = []
    for label, runs in records.items():
        row: dict[str, Any] = {"variant": label}
        for step in at:
            row[f"step {step}"] = " / ".join(f"{dict(zip(curve_of(r).steps, curve_of(r).values))[step]:.2f}"
                                             for r in runs)
        row["final"] = " / ".join(f"{r['final']:.3f}" for r in runs)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(DEFAULTS_STEMS), required=True)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--e-stem", help="E's record stem under the regime's results (default: the study's, "
                                         "where the defaults' intervals were set explicitly)")
    args = parser.parse_args(argv)
    records = {label: [json.loads(p.read_text()) for p in paths]
               for label, paths in record_paths(args.regime, args.results, e_stem=args.e_stem).items()}
    found = rows(records, AT[args.regime])
    print(table(found, list(found[0])))
    out = args.results / args.regime / "grafting_tune.png"
    plot_curves(records, title=f"{args.regime} regime, tune part, LAMB's lr: K-FAC's direction vs its size "
                               f"(seeds {', '.join(map(str, SEEDS))})",
                ylabel="held-out MLM loss (tune part)", out=out)
    print(f"wrote {out}")
    return found


if __name__ == "__main__":
    main()
