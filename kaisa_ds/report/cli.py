"""``python -m kaisa_ds.report RUN_DIR``: PNG plots of a run's K-FAC diagnostics, readable at a glance.

Reads ``RUN_DIR/metrics.jsonl`` (rows with a ``kfac`` object, as ``bert_pretrain`` writes them from
``KFACPreconditioner.diagnostics_snapshot()``) and writes ``RUN_DIR/kfac_diagnostics.png``: the KL-clip scale ν (how
much of each step K-FAC's trust region cuts), damping and learning rate in force, the eigenvalue range of every
layer group's A and G factors at each decomposition against the damping (eigenvalues far below the damping mean the
damping dominates that direction), the decomposition age, and skipped windows and failed decompositions; and the
effectiveness check of each decomposition per layer group: the share of the gradient on which damping outweighs the
curvature and the cosine between the preconditioned and the raw gradient (both near 1: K-FAC has become a rescaled
gradient); and the coverage: the trainable parameters of each module type, preconditioned or not and why (also
printed as text); and the gradient noise scale ``B_simple`` against the step, beside the batch the run stepped with.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from kaisa_ds.report.metrics_log import read_rows

logger = logging.getLogger(__name__)


def kfac_rows(metrics: Path) -> list[dict[str, Any]]:
    """``{step, ...diagnostics}`` rows of a metrics.jsonl (a torn last line is skipped)."""
    if not metrics.is_file():
        raise FileNotFoundError(f"{metrics} does not exist: give the run folder that holds metrics.jsonl")
    rows = [{"step": r["step"], **r["kfac"]} for r in read_rows(metrics)
            if isinstance(r.get("kfac"), dict) and "step" in r]
    if not rows:
        raise ValueError(f"{metrics} has no K-FAC diagnostics (was the run trained with kfac.enabled?)")
    return rows


def plot(rows: list[dict[str, Any]], out: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 4, figsize=(24, 8))
    nu, values, eig, covered, faults, share, cosine, noise = axes.flat
    _coverage(covered, next((r["coverage"] for r in rows if r.get("coverage")), None))
    _noise_scale(noise, rows)
    nu.plot(steps, [r["kl_scale"] if r["kl_scale"] is not None else float("nan") for r in rows])
    nu.set(title="KL-clip scale ν (1: step not cut)", xlabel="step", ylim=(0, 1.05))
    mode = rows[-1].get("damping_mode", "absolute")  # None under adaptive eigenvalues: no damping to draw
    values.plot(steps, [r["damping"] if r["damping"] is not None else float("nan") for r in rows],
                label=f"damping ({mode or 'none: adaptive eigenvalues'})")
    values.plot(steps, [r["lr"] for r in rows], label="learning rate")
    values.set(title="values in force", xlabel="step", yscale="log")
    values.legend()
    decomposition_rows = [r for r in rows if r.get("eigenvalues")]  # constant between decompositions: steps
    for group in sorted({g for r in decomposition_rows for g in r["eigenvalues"]}):
        xs = [r["step"] for r in decomposition_rows if group in r["eigenvalues"]]
        low = [max(r["eigenvalues"][group]["min"], 1e-30) for r in decomposition_rows if group in r["eigenvalues"]]
        high = [r["eigenvalues"][group]["max"] for r in decomposition_rows if group in r["eigenvalues"]]
        line = eig.plot(xs, high, label=group.split(".", 2)[-1] if len(group) > 40 else group)[0]
        eig.plot(xs, low, ":", color=line.get_color())
    if mode == "absolute":  # relative damping is per layer: its scale is in the damping-share panel
        eig.plot(steps, [r["damping"] for r in rows], "k--", label="damping")
    eig.set(title="eigenvalues of the decompositions in force (solid max, dotted min)", xlabel="step",
            yscale="log")
    eig.legend(fontsize=6, ncol=2)
    faults.plot(steps, [r["skipped_windows"] for r in rows], label="skipped windows (overflow)")
    faults.plot(steps, [r["failed_decompositions"] for r in rows], label="failed decompositions")
    faults.plot(steps, [r["decomposition_age"] if r["decomposition_age"] is not None else float("nan")
                        for r in rows], label="decomposition age (steps)")
    faults.set(title="faults and staleness", xlabel="step")
    faults.legend()
    _effectiveness(share, cosine, rows)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _noise_scale(ax: Any, rows: list[dict[str, Any]]) -> None:
    """The gradient noise scale B_simple against the step, with the batch the run stepped with."""
    measured = [r for r in rows if r.get("noise_scale")]
    if not measured:
        ax.axis("off")
        ax.text(0.5, 0.5, "noise scale not measured\n(one pass on one rank, or a run before 2026-12-02)", ha="center")
        return
    steps = [r["step"] for r in measured]
    ax.plot(steps, [r["noise_scale"]["b_simple"] for r in measured], label="B_simple (samples)")
    ax.plot(steps, [r["noise_scale"]["samples_per_step"] for r in measured], "k--", label="samples per step")
    ax.set(title="gradient noise scale (McCandlish et al. 2018): the critical batch's scale", xlabel="step",
           yscale="log")
    ax.legend(fontsize=7)


def coverage_lines(summary: dict[str, Any] | None) -> list[str]:
    """The coverage of a run (``diagnostics_snapshot()["coverage"]``) as text: shares, then type by type."""
    if not summary:
        return ["coverage: not recorded (a run before 2026-12-02)"]
    lines = [f"K-FAC preconditions {summary['preconditioned']:,} of {summary['trainable']:,} trainable parameters "
             f"({summary['share']:.1%}; {summary['linear_share']:.1%} of the untied linear-like ones)"]
    for type_name, verdicts in sorted(summary["by_type"].items(), key=lambda kv: -sum(kv[1].values())):
        lines += [f"  {type_name:<32} {verdict:<16} {params:>14,}" for verdict, params in verdicts.items() if params]
    lines += [f"  warning: {t} is not supported and holds {n:,} parameters" for t, n in
              summary.get("heavy_unsupported", {}).items()]
    lines += [f"  note: {note}" for note in summary.get("notes", [])]
    return lines


def _coverage(ax: Any, summary: dict[str, Any] | None) -> None:
    """Horizontal bars: trainable parameters per module type, split by verdict."""
    if not summary:
        ax.axis("off")
        ax.text(0.5, 0.5, "coverage not recorded", ha="center")
        return
    types = sorted(summary["by_type"], key=lambda t: sum(summary["by_type"][t].values()))[-12:]
    verdicts = sorted({v for t in types for v in summary["by_type"][t]})
    left = [0.0] * len(types)
    for verdict in verdicts:
        widths = [summary["by_type"][t].get(verdict, 0) for t in types]
        ax.barh(types, widths, left=left, label=verdict)
        left = [a + b for a, b in zip(left, widths)]
    ax.set(title=f"coverage: {summary['share']:.0%} of parameters, {summary['linear_share']:.0%} of linear-like",
           xlabel="trainable parameters")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7)


def _effectiveness(share: Any, cosine: Any, rows: list[dict[str, Any]]) -> None:
    """Per layer group, at each decomposition: damping share and cosine to the raw gradient."""
    checked = [r for r in rows if r.get("effectiveness")]
    for group in sorted({g for r in checked for g in r["effectiveness"]}):
        label = group.split(".", 2)[-1] if len(group) > 40 else group
        xs = [r["step"] for r in checked if group in r["effectiveness"]]
        share.plot(xs, [r["effectiveness"][group]["damping_share"] for r in checked if group in r["effectiveness"]],
                   label=label)
        cosine.plot(xs, [r["effectiveness"][group]["cosine"] for r in checked if group in r["effectiveness"]],
                    label=label)
    share.set(title="damping share, gradient-weighted (1: rescaled gradient)", xlabel="step",
              ylim=(0, 1.05))
    cosine.axhline(0.99, color="k", ls="--", lw=0.8)
    cosine.set(title="cosine(preconditioned, raw gradient) (≥ 0.99: K-FAC changes nothing)", xlabel="step",
               ylim=(-1.05, 1.05))
    for ax in (share, cosine):
        if checked:
            ax.legend(fontsize=6)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kaisa_ds.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a run folder holding metrics.jsonl (e.g. runs/mission/kfac/phase1)")
    p.add_argument("--out", type=Path, help="PNG to write (default: RUN_DIR/kfac_diagnostics.png)")
    args = p.parse_args(argv)
    try:
        rows = kfac_rows(args.run_dir / "metrics.jsonl")
    except (FileNotFoundError, ValueError) as exc:
        p.error(str(exc))
    out = args.out or args.run_dir / "kfac_diagnostics.png"
    plot(rows, out, title=f"K-FAC diagnostics: {args.run_dir}")
    logger.info("wrote %s", out)
    for line in coverage_lines(next((r["coverage"] for r in rows if r.get("coverage")), None)):
        print(line)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
