"""The scaling study's plot: steps to each target against batch (log-log, with the perfect-scaling line and the
fitted ``S(B)``), training time to target against batch, and K-FAC's per-step overhead against batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.convergence.scaling_fit import OPTIMIZERS, mean_or_none

COLOURS = {"lamb": "tab:blue", "kfac": "tab:red"}
LABELS = {"lamb": "LAMB (tuned per batch)", "kfac": 'K-FAC ({"enabled": true}, LAMB\'s lr)'}
STYLES = ("o-", "s--")  # early target, late target
MISSED = ("x", "+")  # the same targets, where a seed never reached them within its run


def not_reached(per_batch: dict[int, dict[str, Any]], opt: str, key: str) -> list[int]:
    """The batches at which a run of ``opt`` never reached the target ``key``: a mean would hide them, so the plot
    marks them on the axis' top edge instead of leaving a gap a reader takes for a missing run."""
    return [b for b in sorted(per_batch) if per_batch[b]["runs"][opt]
            and any(r["targets"][key]["step"] is None for r in per_batch[b]["runs"][opt])]


def plot_scaling(summary: dict[str, Any], *, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_batch = {int(k): v for k, v in summary["per_batch"].items()}
    batches = sorted(per_batch)
    labels = dict(LABELS)
    if summary.get("candidate"):  # a candidate default's reruns: say which K-FAC ran
        keys = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in summary["candidate"].items())
        labels["kfac"] = f'K-FAC ({{"enabled": true, {keys}}}, LAMB\'s lr)'
    fig, (steps_ax, time_ax, cost_ax) = plt.subplots(1, 3, figsize=(18, 5.5))
    for opt in OPTIMIZERS:
        for style, target in zip(STYLES, summary["targets"]):
            key = f"{target:.4f}"
            for ax, field in ((steps_ax, "step"), (time_ax, "seconds")):
                xs, ys = [], []
                for b in batches:
                    value = mean_or_none([f["targets"][key][field] for f in per_batch[b]["runs"][opt]])
                    if value is not None:
                        xs.append(b)
                        ys.append(value)
                if xs:
                    ax.plot(xs, ys, style, color=COLOURS[opt], label=f"{labels[opt]}, loss {target:.2f}")
                missed = not_reached(per_batch, opt, key)
                if missed:
                    ax.scatter(missed, [0.97] * len(missed), marker=MISSED[STYLES.index(style)], s=60,
                               color=COLOURS[opt], transform=ax.get_xaxis_transform(), clip_on=False,
                               label=f"{labels[opt]}: a seed never reached {target:.2f}")
            fit = summary["fits"][opt][key]
            if fit["s_min"] is not None and fit["b_crit_tokens"] is not None and fit["b_crit_tokens"] > 0:
                curve = [fit["s_min"] * (1 + fit["b_crit_tokens"] / b) for b in batches]
                steps_ax.plot(batches, curve, ":", color=COLOURS[opt], alpha=0.6)
    lamb_first = next((mean_or_none([f["targets"][f"{summary['targets'][-1]:.4f}"]["step"]
                                     for f in per_batch[b]["runs"]["lamb"]]) for b in batches[:1]), None)
    if lamb_first is not None:
        steps_ax.plot(batches, [lamb_first * batches[0] / b for b in batches], "k:", label="perfect scaling (late)")
    noise = summary.get("noise_tokens")
    for ax in (steps_ax, time_ax):
        if noise:
            ax.axvline(noise, color="grey", lw=0.8, label="noise scale B_simple (LAMB, smallest batch)")
        ax.set(xscale="log", yscale="log", xlabel="batch (tokens a step)")
        ax.legend(fontsize=7)
    steps_ax.set(title="steps to target (dotted: fitted S_min (1 + B_crit / B))", ylabel="optimizer steps")
    time_ax.set(title="training time to target", ylabel="seconds (2 CPU cores)")
    overheads = [(b, per_batch[b].get("kfac_step_overhead")) for b in batches]
    shown = [(b, o * 100) for b, o in overheads if o is not None]
    if shown:
        cost_ax.plot([b for b, _ in shown], [o for _, o in shown], "o-", color=COLOURS["kfac"])
    cost_ax.axhline(0, color="k", lw=0.5)
    cost_ax.set(xscale="log", title="K-FAC's per-step overhead over LAMB", xlabel="batch (tokens a step)",
                ylabel="% of a LAMB step")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
