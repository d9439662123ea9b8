"""Per-step metrics as JSONL (truncated on resume so the curve continues) and the loss plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLog:
    def __init__(self, path: Path, *, enabled: bool, resume_step: int | None = None) -> None:
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[str] = []
        if resume_step is not None and path.is_file():
            kept = [ln for ln in path.read_text().splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
        path.write_text("".join(ln + "\n" for ln in kept))

    def write(self, **row: Any) -> None:
        if self.enabled:
            with self.path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(ln) for ln in self.path.read_text().splitlines() if ln.strip()]


def plot_losses(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "heldout_mlm_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="training loss (MLM + NSP)")
    if evals:
        ax.plot([r["step"] for r in evals], [r["heldout_mlm_loss"] for r in evals], "o-", label="held-out MLM loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
