"""report.md with a results table and PNG loss curves of both pretraining variants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def plot_losses(runs: dict[str, Path], out: Path) -> None:
    """Training loss against step, phase 1 and phase 2 side by side, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, phase in zip(axes, ("phase1", "phase2")):
        for label, root in runs.items():
            rows = [r for r in read_jsonl(root / phase / "metrics.jsonl") if "loss" in r and "step" in r]
            if rows:
                ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=label)
        ax.set_title(f"{phase}: training loss (MLM + NSP)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss")
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_report(out_dir: Path, runs: dict[str, Path], seconds: dict[str, dict[str, float]],
                 settings: dict[str, Any]) -> Path:
    plot = out_dir / "loss_curves.png"
    plot_losses(runs, plot)
    lines = ["# kaisa_ds main job: LAMB vs. LAMB + K-FAC", "",
             "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), "",
             "| run | phase-1 steps | phase-2 steps | pretrain wall s | final phase-1 loss | final phase-2 loss "
             "| held-out MLM acc | SQuAD EM | SQuAD F1 | F1 before fine-tuning |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, root in runs.items():
        p1, p2 = read_json(root / "phase1" / "summary.json"), read_json(root / "phase2" / "summary.json")
        squad = read_json(root / "squad" / "eval_results.json")
        before = next((r for r in read_jsonl(root / "squad" / "metrics.jsonl")
                       if r.get("event") == "eval" and r.get("step") == 0), {})
        wall = seconds[label].get("phase1", 0.0) + seconds[label].get("phase2", 0.0)

        def fmt(v: Any, spec: str = ".4f") -> str:
            return format(v, spec) if isinstance(v, (int, float)) else "n/a"

        lines.append(f"| {label} | {p1.get('steps', 'n/a')} | {p2.get('steps', 'n/a')} | {wall:.0f} | "
                     f"{fmt(p1.get('final_train_loss'))} | {fmt(p2.get('final_train_loss'))} | "
                     f"{fmt(p2.get('heldout_mlm_accuracy'))} | {fmt(squad.get('exact_match'), '.2f')} | "
                     f"{fmt(squad.get('f1'), '.2f')} | {fmt(before.get('f1'), '.2f')} |")
    lines += ["", "![loss curves](loss_curves.png)", "", "Wall seconds per stage:", ""]
    for label, stages in seconds.items():
        lines.append(f"- {label}: " + ", ".join(f"{k} {v:.0f} s" for k, v in stages.items()))
    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report
