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
    """Held-out MLM loss (solid) per optimizer, every seed, beside the training loss as logged (dropout on, window
    means, dashed) and, where recorded, the training part evaluated with dropout off (dotted). Read the dotted
    curves to tell optimisation from generalisation: the logged one also carries each model's dropout cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = (("curve", "-", "held-out"), ("train_curve", "--", "training, dropout on (mean since last evaluation)"),
             ("train_eval_curve", ":", "training part evaluated (dropout off)"))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, runs in records.items():
        color = COLORS.get(name, "tab:red")
        for i, record in enumerate(sorted(runs, key=lambda r: r["spec"]["seed"])):
            for key, style, what in lines:
                if key in record:
                    ax.plot(record[key]["steps"], record[key]["values"], color=color, ls=style, alpha=0.8,
                            lw=1.2 if key == "curve" else 1,
                            label=f"{LABELS.get(name, name)}: {what}" if i == 0 else None)
    ax.set(xlabel="optimizer step", ylabel="MLM loss",
           ylim=loss_range([record[key]["values"] for runs in records.values() for record in runs
                            for key, _, _ in lines if key in record]))
    _save(fig, ax, title=title, fontsize=10, out=out)


def loss_range(curves: list[list[float]], *, ceiling: float = 8.0, margin: float = 0.1) -> tuple[float, float]:
    """The y range of a loss plot: down to the lowest point of every curve (a fixed floor cut off BERT-mini's
    dropout-off training curves, the ones that tell optimisation from generalisation), up to ``ceiling`` at most
    (the first steps' losses of ~10 would flatten the rest)."""
    values = [v for curve in curves for v in curve]
    if not values:
        return 0.0, ceiling
    return min(values) - margin, min(ceiling, max(values) + margin)


def plot_curves(records: dict[str, list[dict[str, Any]]], *, title: str, ylabel: str, out: Path) -> None:
    """Held-out curves by optimizer step, one colour per named setting, every seed of it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, (name, runs) in enumerate(records.items()):
        for j, record in enumerate(runs):
            curve = curve_of(record)
            ax.plot(curve.steps, curve.values, color=f"C{i}", alpha=0.8, lw=1.2, label=name if j == 0 else None)
    ax.set(xlabel="optimizer step", ylabel=ylabel)
    _save(fig, ax, title=title, fontsize=9, out=out)


def _save(fig: Any, ax: Any, *, title: str, fontsize: int, out: Path) -> None:
    """Legend, title, tight layout; write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=fontsize)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
