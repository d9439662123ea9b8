"""Per-step metrics: a JSONL file (cut back on resume so the curve continues), DeepSpeed's monitor, the plot."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from kaisa_ds.checkpoint.atomic import write_atomic
from kaisa_ds.report.metrics_log import MetricsError, read_rows

logger = logging.getLogger(__name__)
__all__ = ["MetricsError", "MetricsLog", "plot_losses", "read_rows"]
MONITORED = ("loss", "mlm_loss", "nsp_loss", "lr", "seq_per_s", "heldout_mlm_loss", "heldout_mlm_accuracy",
             "heldout_nsp_accuracy")


class MetricsLog:
    """Rows of ``{"step": N, ...}``; only rank 0 writes (``enabled``)."""

    def __init__(self, path: Path, *, enabled: bool, resume_step: int | None = None) -> None:
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        kept: list[dict[str, Any]] = []
        if resume_step is not None and path.is_file():  # rows written after the checkpoint are redone
            kept = [r for r in read_rows(path) if r.get("step", 0) <= resume_step]
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept).encode())

    def write(self, row: dict[str, Any], *, engine: Any = None) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        monitor = getattr(engine, "monitor", None)
        if monitor is not None and getattr(monitor, "enabled", False):
            samples = int(getattr(engine, "global_samples", row["step"]))
            monitor.write_events([(f"Train/bert/{k}", float(row[k]), samples) for k in MONITORED if k in row])

    def rows(self) -> list[dict[str, Any]]:
        return read_rows(self.path)


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
