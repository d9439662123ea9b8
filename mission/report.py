"""report.md and report.json: a results table, held-out MLM loss against steps and training seconds (PNG), and
the steps and seconds each variant needed to reach LAMB's final held-out MLM loss."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bert_pretrain.curves import Curve, best_point, first_crossing, heldout_curve
from kaisa_ds.report.metrics_log import read_rows
from mission.kfac_interval import describe, interval_changes

BASELINE = "lamb"  # the variant whose final held-out loss is the target
logger = logging.getLogger("mission")


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def phase1_curve(root: Path) -> Curve:
    """Phase 1's held-out MLM loss (the documents held out of the corpus) at each evaluation."""
    return heldout_curve(read_rows(root / "phase1" / "metrics.jsonl"))


def plot_losses(runs: dict[str, Path], out: Path) -> None:
    """Training loss against step, phase 1 and phase 2 side by side, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, phase in zip(axes, ("phase1", "phase2")):
        for label, root in runs.items():
            rows = [r for r in read_rows(root / phase / "metrics.jsonl") if "loss" in r and "step" in r]
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


def plot_heldout(runs: dict[str, Path], out: Path, *, target: float | None) -> None:
    """Phase 1's held-out MLM loss against optimizer steps and against training seconds, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for label, root in runs.items():
        curve = phase1_curve(root)
        if curve.values:
            by_step.plot(curve.steps, curve.values, "o-", ms=3, label=label)
            by_time.plot(curve.seconds, curve.values, "o-", ms=3, label=label)
    for ax, xlabel in ((by_step, "optimizer step"), (by_time, "training seconds (evaluation excluded)")):
        if target is not None:
            ax.axhline(target, color="grey", ls=":", label="LAMB's final")
        ax.set(xlabel=xlabel, ylabel="held-out MLM loss", title="phase 1: held-out MLM loss")
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def recorded_kfac(root: Path) -> dict[str, bool | None]:
    """Whether each pretraining phase trained with K-FAC, as its summary.json records it (None: not recorded)."""
    return {phase: read_json(root / phase / "summary.json").get("kfac") for phase in ("phase1", "phase2")}


def recorded_label(kfac: dict[str, bool | None], *, requested: str) -> str:
    """The row's label from what the phases recorded, not from the variant's name: a K-FAC variant given a LAMB
    config (``--kfac-phase1-config ds_configs/bert_tiny_phase1.json``) is reported as what it ran."""
    used = [kfac["phase1"], kfac["phase2"]]
    if None in used:
        return f"{requested} (K-FAC use not recorded)"
    label = "LAMB + K-FAC" if all(used) else "LAMB" if not any(used) else \
        f"LAMB + K-FAC (phase {1 if used[0] else 2} only)"
    return label if label == requested else f"{label}; requested as {requested}"  # rows stay distinct


def variant_figures(root: Path, stage_seconds: dict[str, float], *, target: float | None,
                    best: float | None = None) -> dict[str, Any]:
    """One variant's report.json entry; ``target`` is LAMB's final phase-1 held-out MLM loss, ``best`` its lowest
    (a LAMB whose loss rises late would otherwise hand out a win against its final)."""
    curve = phase1_curve(root)
    hit = first_crossing(curve, target) if target is not None and curve.values else None
    hit_best = first_crossing(curve, best) if best is not None and curve.values else None
    p1, p2 = read_json(root / "phase1" / "summary.json"), read_json(root / "phase2" / "summary.json")
    squad = read_json(root / "squad" / "eval_results.json")
    phase_rows = [read_rows(root / phase / "metrics.jsonl") for phase in ("phase1", "phase2")]
    return {
        "phase1_train_seconds": curve.seconds[-1] if curve.seconds else None,
        "phase1_stopped_at_heldout": p1.get("stopped_at_heldout"),
        "pretrain_seconds": stage_seconds.get("phase1", 0.0) + stage_seconds.get("phase2", 0.0) or None,
        "pretrain_train_seconds": sum(rows[-1].get("elapsed_s", 0.0) for rows in phase_rows if rows) or None,
        "phase1_steps": p1.get("steps"), "phase2_steps": p2.get("steps"),
        "final_heldout_mlm": curve.final, "phase2_final_heldout_mlm": p2.get("heldout_mlm_loss"),
        "steps_to_lamb_final": hit.step if hit else None, "seconds_to_lamb_final": hit.seconds if hit else None,
        "steps_to_lamb_best": hit_best.step if hit_best else None,
        "seconds_to_lamb_best": hit_best.seconds if hit_best else None,
        "squad_f1": squad.get("f1"), "squad_em": squad.get("exact_match"),
        "heldout_curve": {"steps": curve.steps, "seconds": curve.seconds, "values": curve.values},
        "phase1_decomposition_intervals": interval_changes(phase_rows[0]),
    }


def add_ratios(figures: dict[str, dict[str, Any]]) -> None:
    """Each variant's steps and training seconds to LAMB's final as fractions of LAMB's whole phase 1, and to LAMB's
    best as fractions of the steps and seconds LAMB needed to reach its best (:func:`best_point`)."""
    lamb = figures.get(BASELINE, {})
    curve = lamb.get("heldout_curve") or {}
    best = best_point(Curve(**curve)) if curve else None
    whole = {"final": (lamb.get("phase1_train_seconds"), curve["steps"][-1] if curve.get("steps") else None),
             "best": (best.seconds, best.step) if best else (None, None)}
    for f in figures.values():
        for which, (total_s, total_steps) in whole.items():
            seconds, steps = f.get(f"seconds_to_lamb_{which}"), f.get(f"steps_to_lamb_{which}")
            f[f"time_ratio_to_lamb_{which}"] = seconds / total_s if seconds is not None and total_s else None
            f[f"step_ratio_to_lamb_{which}"] = steps / total_steps if steps is not None and total_steps else None


def headline(figures: dict[str, dict[str, Any]]) -> list[str]:
    """The report's first lines: for each variant but LAMB, the share of LAMB's phase-1 training time it needed
    to reach LAMB's final held-out MLM loss, and the F1 of the model taken there."""
    lamb = figures.get(BASELINE)
    if lamb is None or lamb.get("final_heldout_mlm") is None:
        return ["LAMB's phase 1 has no held-out loss: no time to compare."]
    lines = []
    for name, f in figures.items():
        if name == BASELINE:
            continue
        where = (f"its phase 1 ended there (at step {f['phase1_steps']}) and that model was fine-tuned"
                 if f.get("phase1_stopped_at_heldout") is not None else "its phase 1 ran all its steps")
        if f.get("time_ratio_to_lamb_final") is None:
            lines.append(f"**{f['label']} never reached LAMB's final phase-1 held-out MLM loss "
                         f"({lamb['final_heldout_mlm']:.4f})**: its final was {_fmt(f['final_heldout_mlm'])}.")
            continue
        lines.append(f"**{f['label']} reached LAMB's final phase-1 held-out MLM loss "
                     f"({lamb['final_heldout_mlm']:.4f}) in {f['time_ratio_to_lamb_final']:.2f}× LAMB's phase-1 "
                     f"training time** ({f['seconds_to_lamb_final']:.0f} s against {lamb['phase1_train_seconds']:.0f} "
                     f"s; {f['step_ratio_to_lamb_final']:.2f}× its steps); {where}. SQuAD F1 "
                     f"{_fmt(f['squad_f1'], '.2f')} against LAMB's full run's {_fmt(lamb['squad_f1'], '.2f')}.")
        best = min(lamb["heldout_curve"]["values"])
        if best < lamb["final_heldout_mlm"]:  # LAMB's loss rose late: its best is the fairer target
            ratio = f.get("time_ratio_to_lamb_best")
            lines.append(f"LAMB's held-out loss rose after its best ({best:.4f}): " + (
                f"{f['label']} reached its best in {ratio:.2f}× the training time LAMB needed to reach it."
                if ratio is not None
                else f"**{f['label']} never reached its best.**"))
    return lines


def _fmt(v: Any, spec: str = ".4f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "n/a"


def write_report(out_dir: Path, runs: dict[str, Path], seconds: dict[str, dict[str, float]],
                 settings: dict[str, Any], *, warnings: Sequence[str] = ()) -> Path:
    """report.md (table, plots, what was measured) and report.json (the same figures per variant).

    ``runs`` maps the requested variant names to their folders; each row is labelled by what its phases recorded
    (:func:`recorded_label`), and a label that differs from the request joins ``warnings``, which both files show
    at the top."""
    warnings = list(warnings)
    roots = {root.name: root for root in runs.values()}
    lamb_curve = phase1_curve(roots[BASELINE]) if BASELINE in roots else None
    target = lamb_curve.final if lamb_curve else None
    best = min(lamb_curve.values) if lamb_curve and lamb_curve.values else None
    figures = {root.name: variant_figures(root, seconds.get(label, {}), target=target, best=best)
               for label, root in runs.items()}
    labels = {}
    for requested, root in runs.items():
        kfac = recorded_kfac(root)
        labels[requested] = recorded_label(kfac, requested=requested)
        figures[root.name].update(label=labels[requested], kfac=kfac)
        if labels[requested] != requested:
            warnings.append(f"the variant run as '{requested}' recorded K-FAC {kfac} in its phase summaries: its row "
                            f"is labelled '{labels[requested]}'")
            logger.warning("%s", warnings[-1])
    add_ratios(figures)
    shown = {labels[k]: root for k, root in runs.items()}
    plot_losses(shown, out_dir / "loss_curves.png")
    plot_heldout(shown, out_dir / "heldout_curves.png", target=target)
    intervals = [describe(f["label"], f["phase1_decomposition_intervals"]) for f in figures.values()]
    lines = ["# kaisa_ds main job: " + " vs. ".join(labels.values()), "",
             *(f"**Warning:** {w}" + "\n" for w in warnings),
             *headline(figures), "",
             *(f"{line}\n" for line in intervals if line),
             "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), "",
             "| run | phase-1 steps | phase-2 steps | pretrain wall s | final phase-1 loss | final phase-2 loss "
             "| held-out MLM acc | SQuAD EM | SQuAD F1 | F1 before fine-tuning | phase-1 held-out MLM "
             "| steps to LAMB's final | training s to LAMB's final |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, root in runs.items():
        p1, p2 = read_json(root / "phase1" / "summary.json"), read_json(root / "phase2" / "summary.json")
        squad = read_json(root / "squad" / "eval_results.json")
        before = next((r for r in read_rows(root / "squad" / "metrics.jsonl")
                       if r.get("event") == "eval" and r.get("step") == 0), {})
        wall = seconds.get(label, {}).get("phase1", 0.0) + seconds.get(label, {}).get("phase2", 0.0)
        f = figures[root.name]
        lines.append(f"| {labels[label]} | {p1.get('steps', 'n/a')} | {p2.get('steps', 'n/a')} | {wall:.0f} | "
                     f"{_fmt(p1.get('final_train_loss'))} | {_fmt(p2.get('final_train_loss'))} | "
                     f"{_fmt(p2.get('heldout_mlm_accuracy'))} | {_fmt(squad.get('exact_match'), '.2f')} | "
                     f"{_fmt(squad.get('f1'), '.2f')} | {_fmt(before.get('f1'), '.2f')} | "
                     f"{_fmt(f['final_heldout_mlm'])} | {_fmt(f['steps_to_lamb_final'], '.1f')} | "
                     f"{_fmt(f['seconds_to_lamb_final'], '.1f')} |")
    lines += ["", "![held-out MLM loss](heldout_curves.png)", "", "![loss curves](loss_curves.png)", "",
              "What was measured, at what scale: " + measured(settings), "", "Wall seconds per stage:", ""]
    for label, stages in seconds.items():
        lines.append(f"- {labels.get(label, label)}: " + ", ".join(f"{k} {v:.0f} s" for k, v in stages.items()))
    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n")
    (out_dir / "report.json").write_text(json.dumps(
        {"settings": settings, "warnings": warnings,
         "target": {"variant": BASELINE, "final_heldout_mlm": target, "best_heldout_mlm": best},
         "variants": figures},
        indent=1) + "\n")
    return report


def measured(settings: dict[str, Any]) -> str:
    """The plain-words scale statement of the report."""
    data = settings.get("data", "built-in")
    corpus = "the built-in generated corpus" if data == "built-in" else f"{data}"
    steps = settings.get("phase1_steps", "?")
    until = (" (K-FAC's until it first reached LAMB's final held-out loss)"
             if settings.get("kfac_until_lamb_final") else "")
    tokens = settings.get("phase1_batch_tokens")
    batch = f", {tokens:,} tokens a step" if tokens else ""
    return (f"BERT-{settings.get('model', '?')} pretrained for {steps} phase-1 steps{until} "
            f"({settings.get('phase1_seq_length', 128)} tokens{batch}) and "
            f"{settings.get('phase2_steps', '?')} phase-2 steps "
            f"(512 tokens) on {settings.get('ranks', '?')} ranks on {corpus}, then fine-tuned on SQuAD-style "
            f"questions; seed {settings.get('seed', '?')}. 'Held-out MLM' is the masked-LM loss on the corpus "
            "documents held out of training (phase 1), evaluated every "
            f"{settings.get('eval_every', '?')} steps and at the end; 'training s' are the summed optimizer-step "
            "seconds (evaluation and checkpointing excluded), interpolated between evaluations where a curve crosses "
            "LAMB's final value; 'pretrain wall s' is the launcher's wall time of both phases (start-up, evaluation "
            "and saving included). One seed on a small model: `python -m benchmarks.mission_seeds` puts several "
            "seeds' reports side by side, and the convergence study's three seeds per regime are the evidence "
            "(docs/studies/defaults.md); nothing here measures BERT-Large.")
