"""Pretraining's side of the metrics log (kaisa_ds.report.metrics_log writes it): the columns DeepSpeed's monitor
receives, and the loss plot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MONITORED = ("loss", "mlm_loss", "nsp_loss", "lr", "seq_per_s", "heldout_mlm_loss", "heldout_mlm_accuracy",
             "heldout_nsp_accuracy")


def send_to_monitor(engine: Any, row: dict[str, Any]) -> None:
    """The ``MONITORED`` columns of ``row`` to the engine's DeepSpeed monitor (TensorBoard, W&B, CSV) when the
    config enables one, against the samples trained so far."""
    monitor = getattr(engine, "monitor", None)
    if monitor is not None and getattr(monitor, "enabled", False):
        samples = int(getattr(engine, "global_samples", row["step"]))
        monitor.write_events([(f"Train/bert/{k}", float(row[k]), samples) for k in MONITORED if k in row])


def plot_losses(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    """Training MLM and NSP losses per step, and the held-out MLM loss and accuracy at each evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "heldout_mlm_loss" in r]
    fig, (ax, acc) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in train]
    ax.plot(steps, [r["loss"] for r in train], label="training loss (MLM + NSP)")
    ax.plot(steps, [r["mlm_loss"] for r in train], label="training MLM loss", alpha=0.7)
    if evals:
        ax.plot([r["step"] for r in evals], [r["heldout_mlm_loss"] for r in evals], "o-", label="held-out MLM loss")
        acc.plot([r["step"] for r in evals], [r["heldout_mlm_accuracy"] for r in evals], "o-", label="MLM accuracy")
        acc.plot([r["step"] for r in evals], [r["heldout_nsp_accuracy"] for r in evals], "s-", label="NSP accuracy")
        acc.plot([r["step"] for r in evals], [r["heldout_mlm_baseline_accuracy"] for r in evals], ":",
                 label="MLM frequent-token baseline")
    ax.set(xlabel="optimizer step", ylabel="loss", title=title)
    acc.set(xlabel="optimizer step", ylabel="held-out accuracy", ylim=(0, 1), title="held-out accuracy")
    ax.legend()
    acc.legend()
    fig.tight_layout()
    tmp = out.with_name(f".{out.stem}.tmp{out.suffix}")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out)
