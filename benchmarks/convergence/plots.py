"""Held-out MLM loss against optimizer steps and against training seconds, one figure per regime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.convergence.analysis import PLATEAU_MARGIN, curve_of

COLORS = {"lamb": "tab:blue", "kfac": "tab:orange", "defaults": "tab:green"}
LABELS = {"lamb": "LAMB", "kfac": "LAMB + K-FAC", "defaults": "LAMB + K-FAC, library defaults"}


def plot_regime(records: dict[str, list[dict[str, Any]]], *, plateau: float, title: str, out: Path) -> None:
    """Every seed's curve (thin) for each optimizer, the plateau and the exit line, LAMB's mean final loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, runs in records.items():
        for i, record in enumerate(sorted(runs, key=lambda r: r["spec"]["seed"])):
            curve = curve_of(record)
            label = f"{LABELS.get(name, name)} (seeds {', '.join(str(r['spec']['seed']) for r in runs)})" \
                if i == 0 else None
            by_step.plot(curve.steps, curve.values, color=COLORS.get(name), alpha=0.8, lw=1.2, label=label)
            by_time.plot(curve.seconds, curve.values, color=COLORS.get(name), alpha=0.8, lw=1.2, label=label)
    lamb = records.get("lamb", [])
    for ax, xlabel in ((by_step, "optimizer step"), (by_time, "training seconds (evaluation excluded)")):
        ax.axhline(plateau, color="grey", ls="--", lw=1, label=f"unigram plateau {plateau:.2f}")
        ax.axhline(plateau - PLATEAU_MARGIN, color="grey", ls=":", lw=1, label=f"plateau − {PLATEAU_MARGIN}")
        if lamb:
            final = sum(r["final"] for r in lamb) / len(lamb)
            ax.axhline(final, color=COLORS["lamb"], ls="-.", lw=1, label=f"LAMB final (mean) {final:.2f}")
        ax.set(xlabel=xlabel, ylabel="held-out MLM loss (report part)")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_train_heldout(records: dict[str, list[dict[str, Any]]], *, title: str, out: Path) -> None:
    """Training MLM loss (window means, dashed) beside held-out MLM loss (solid) per optimizer, every seed: where
    the two optimizers' training losses meet but their held-out losses do not, the gap is generalisation, not
    optimisation speed. Records without a ``train_curve`` show their held-out curve only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, runs in records.items():
        color = COLORS.get(name, "tab:red")
        for i, record in enumerate(sorted(runs, key=lambda r: r["spec"]["seed"])):
            label = LABELS.get(name, name) if i == 0 else None
            curve = record["curve"]
            ax.plot(curve["steps"], curve["values"], color=color, lw=1.2, alpha=0.8,
                    label=f"{label}: held-out" if label else None)
            if "train_curve" in record:
                train = record["train_curve"]
                ax.plot(train["steps"], train["values"], color=color, lw=1, ls="--", alpha=0.8,
                        label=f"{label}: training, dropout on (mean since last evaluation)" if label else None)
            if "train_eval_curve" in record:
                train = record["train_eval_curve"]
                ax.plot(train["steps"], train["values"], color=color, lw=1, ls=":", alpha=0.9,
                        label=f"{label}: training part evaluated (dropout off)" if label else None)
    ax.set(xlabel="optimizer step", ylabel="MLM loss", ylim=(4.5, 8))
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
