"""Amendment 7's choice of K-FAC's rate factor (docs/studies/batch_scaling.md): K-FAC's rate is ``c`` × LAMB's chosen
rate at each batch, and one ``c`` is chosen once, for every batch and model, from tune-part probes.

Each cell (a model at a batch) holds LAMB's tune grid (``chosen.json``) and one probe per factor
(``--stage probe --kfac-lr-scale c``, ``scaling_probe.py``), all on the tune part with the tuning seed. A cell's gap
at ``c`` is the probe's final held-out loss minus LAMB's chosen final. The lowest mean gap over the cells chooses; a
mean within :data:`TIE` nats of today's factor 1 keeps 1. Timing plays no part, so these runs need not be alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.convergence.scaling_probe import probe_name, read_chosen

FACTORS = (0.25, 0.5, 1.0)
CELL_BATCHES = (2048, 8192, 32768)
TIE = 0.02  # nats: a mean gap this close to factor 1's keeps today's defaults
RULE_TEXT = ("lowest mean over the cells of (K-FAC's final at c x LAMB's chosen rate) - (LAMB's chosen final), "
             "tune part, seed 0; within 0.02 nats of c = 1 keeps 1 (docs/studies/batch_scaling.md, amendment 7)")


@dataclass(frozen=True)
class Cell:
    """One model at one batch: where its records are."""

    model_size: str
    tokens: int
    results: Path  # the study's results folder (benchmarks/results/convergence/scaling[_mini])

    @property
    def name(self) -> str:
        return f"{self.model_size}/b{self.tokens}"

    def probe_path(self, factor: float, kfac: dict[str, Any] | None = None) -> Path:
        return self.results / f"b{self.tokens}" / "tune" / f"{probe_name(lr_scale=factor, kfac=kfac or {})}.json"


STUDY_FOLDERS = {"tiny": "scaling", "mini": "scaling_mini"}  # each model's results folder under the study's root


def both_models_cells(root: Path, batches: tuple[int, ...] | list[int] = CELL_BATCHES) -> list[Cell]:
    """Both models' cells at ``batches``, their records under ``root`` (benchmarks/results/convergence)."""
    return [Cell(model_size=model, tokens=tokens, results=root / folder)
            for model, folder in STUDY_FOLDERS.items() for tokens in batches]


def lamb_chosen(cell: Cell) -> tuple[float, float]:
    """LAMB's chosen rate at the cell and its final on the tune part."""
    folder = cell.results / f"b{cell.tokens}"
    chosen = read_chosen(folder, run_tune=f"--stage tune --model-size {cell.model_size} --batches {cell.tokens}")
    lr = float(chosen["lamb"]["lr"])
    finals = {float(k): float(v) for k, v in chosen["finals"].items()}
    if lr not in finals:
        raise SystemExit(f"{folder / 'chosen.json'}: LAMB's chosen rate {lr} has no final in 'finals' {sorted(finals)}")
    return lr, finals[lr]


def probe_final(cell: Cell, factor: float, *, lamb_lr: float, kfac: dict[str, Any] | None = None) -> float:
    """The probe's final, after checking the record is the probe a rule asks for (part, seed, rate, kfac keys)."""
    kfac = kfac or {}
    path = cell.probe_path(factor, kfac)
    if not path.is_file():
        keys = " --kfac-set " + " ".join(f"{k}={v}" for k, v in kfac.items()) if kfac else ""
        raise SystemExit(f"{path} is missing: run python -m benchmarks.convergence scaling --stage probe --text "
                         f"runs/scaling/corpus.txt --model-size {cell.model_size} --batches {cell.tokens} "
                         f"--kfac-lr-scale {factor:g}{keys}")
    record = json.loads(path.read_text())
    spec = record["spec"]
    wrong = {key: spec.get(key) for key, want in (("eval_part", "tune"), ("seed", 0), ("kfac", kfac))
             if spec.get(key) != want}
    if abs(float(spec["lr"]) - lamb_lr * factor) > 1e-9 * max(1.0, lamb_lr):
        wrong["lr"] = spec["lr"]
    if wrong or record.get("final") is None:
        raise SystemExit(f"{path}: not the rule's probe (tune part, seed 0, kfac keys {kfac}, rate "
                         f"{lamb_lr * factor:g}, a final): {wrong or 'no final'}")
    return float(record["final"])


def choose_factor(gaps: dict[str, dict[float, float]], *, factors: tuple[float, ...] = FACTORS,
                  tie: float = TIE) -> tuple[float, dict[float, float]]:
    """The rule's factor and the mean gap of each factor over the cells (``gaps``: cell → factor → gap)."""
    if 1.0 not in factors:
        raise ValueError("the rule compares against today's factor 1; it must be a candidate")
    means = {c: sum(cell[c] for cell in gaps.values()) / len(gaps) for c in factors}
    best = min(factors, key=lambda c: (means[c], c))
    return (1.0 if means[1.0] - means[best] <= tie else best), means


def rate_study(cells: list[Cell], *, factors: tuple[float, ...] = FACTORS) -> dict[str, Any]:
    """Every cell's gaps, the means and the choice, as the record ``scaling_rate.json`` keeps them."""
    rows: dict[str, dict[str, Any]] = {}
    gaps: dict[str, dict[float, float]] = {}
    for cell in cells:
        lr, lamb_final = lamb_chosen(cell)
        finals = {c: probe_final(cell, c, lamb_lr=lr) for c in factors}
        gaps[cell.name] = {c: finals[c] - lamb_final for c in factors}
        rows[cell.name] = {"lamb_lr": lr, "lamb_final": lamb_final,
                           "kfac_final": {f"{c:g}": v for c, v in finals.items()},
                           "gap": {f"{c:g}": v for c, v in gaps[cell.name].items()},
                           "records": [str(cell.probe_path(c).relative_to(cell.results.parent)) for c in factors]}
    choice, means = choose_factor(gaps, factors=factors)
    return {"rule": RULE_TEXT, "factors": list(factors), "cells": rows,
            "mean_gap": {f"{c:g}": v for c, v in means.items()}, "choice": choice}


def plot_rate(result: dict[str, Any], path: Path) -> Path:
    """Each cell's gap against the factor, the mean in black: where the rule's choice comes from at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factors = result["factors"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in result["cells"].items():
        ax.plot(factors, [row["gap"][f"{c:g}"] for c in factors], marker="o", alpha=0.7, label=name)
    ax.plot(factors, [result["mean_gap"][f"{c:g}"] for c in factors], color="black", lw=2.5, label="mean (the rule)")
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(factors, [f"{c:g}" for c in factors])
    ax.set_xlabel("c: K-FAC's rate over LAMB's chosen rate")
    ax.set_ylabel("K-FAC's final - LAMB's final (nats, tune part)")
    ax.set_title(f"Amendment 7: the rule chooses c = {result['choice']:g}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
