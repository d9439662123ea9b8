"""The main job over several seeds: each run's ``report.json`` in one table, with spreads, and every seed's held-out
curves in one plot. One ``python -m mission`` run is one seed; a claim about the main job needs more.

    for s in 0 1 2; do python -m mission --seed $s --output runs/mission_seed$s; done
    python -m benchmarks.mission_seeds runs/mission_seed0 runs/mission_seed1 runs/mission_seed2 \\
        --out runs/mission_seeds

Runs must share every setting but the seed (and the SQuAD files' paths, which live in each run's folder).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.convergence.analysis import spread
from benchmarks.harness.output import table, write_json

RATIOS = ("time_ratio_to_lamb_final", "step_ratio_to_lamb_final", "time_ratio_to_lamb_best")  # None: never reached
# settings that may differ between the runs: the seed, and the SQuAD files inside each run's own folder
NOT_COMPARED = ("seed", "squad")
COLUMNS = ("seed", "lamb_final", "kfac_final", "kfac_minus_lamb", "time_ratio_to_lamb_final",
           "step_ratio_to_lamb_final", "time_ratio_to_lamb_best", "cost_per_step", "squad_f1_lamb", "squad_f1_kfac")


def read_report(folder: Path) -> dict[str, Any]:
    path = folder / "report.json"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: run `python -m mission --seed N --output {folder}` first")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def seed_row(report: dict[str, Any]) -> dict[str, Any]:
    """One seed's figures: both finals, K-FAC's ratios to LAMB's final and best (None: never), its cost per step."""
    lamb, kfac = report["variants"]["lamb"], report["variants"]["kfac"]
    lamb_step, kfac_step = (v["phase1_train_seconds"] / v["phase1_steps"] if v.get("phase1_train_seconds") and
                            v.get("phase1_steps") else None for v in (lamb, kfac))
    return {"seed": report["settings"]["seed"], "lamb_final": lamb["final_heldout_mlm"],
            "kfac_final": kfac["final_heldout_mlm"],
            "kfac_minus_lamb": kfac["final_heldout_mlm"] - lamb["final_heldout_mlm"]
            if kfac["final_heldout_mlm"] is not None and lamb["final_heldout_mlm"] is not None else None,
            **{k: kfac.get(k) for k in RATIOS},
            "cost_per_step": kfac_step / lamb_step if kfac_step and lamb_step else None,
            "squad_f1_lamb": lamb.get("squad_f1"), "squad_f1_kfac": kfac.get("squad_f1")}


def summarise(folders: Sequence[Path]) -> dict[str, Any]:
    """Every seed's row and the spread of each column. A ratio's mean is given only when every seed reached LAMB's
    loss: a mean over the seeds that did would hide the ones that never did (``missing`` counts those)."""
    reports = {folder: read_report(folder) for folder in folders}
    first = next(iter(reports.values()))["settings"]
    seen: dict[int, Path] = {}
    for folder, report in reports.items():
        settings = report["settings"]
        if "seed" not in settings:
            raise ValueError(f"{folder}/report.json does not record its seed (made before reports named it): "
                             "run that seed's `python -m mission` again")
        for key in sorted((set(first) | set(settings)) - set(NOT_COMPARED)):
            if settings.get(key) != first.get(key):
                raise ValueError(f"setting {key!r} differs: {first.get(key)!r} in {folders[0]}, "
                                 f"{settings.get(key)!r} in {folder}; summarise runs that differ only by seed")
        if settings["seed"] in seen:
            raise ValueError(f"seed {settings['seed']} twice: {seen[settings['seed']]} and {folder}")
        seen[settings["seed"]] = folder
    rows = sorted((seed_row(r) for r in reports.values()), key=lambda r: r["seed"])
    spreads = {c: spread([r[c] for r in rows]) for c in COLUMNS[1:]}
    for ratio in RATIOS:
        if spreads[ratio]["missing"]:
            spreads[ratio].update(mean=None, std=None)
    reached = sum(r["time_ratio_to_lamb_final"] is not None for r in rows)
    return {"settings": {k: v for k, v in first.items() if k not in NOT_COMPARED},
            "runs": [str(f) for f in folders], "seeds": rows, "spread": spreads,
            "reached_lamb_final": f"{reached} of {len(rows)}",
            "heldout_curves": {r["settings"]["seed"]: {name: v["heldout_curve"] for name, v in r["variants"].items()}
                               for r in reports.values()}}


def markdown(summary: dict[str, Any]) -> str:
    """The per-seed table (never for a ratio not reached) and a mean ± sd row."""
    rows = [{k: ("never" if v is None and k in RATIOS else v) for k, v in r.items()} for r in summary["seeds"]]
    means = {"seed": "mean ± sd"}
    for c, s in summary["spread"].items():
        means[c] = ("—" if s["mean"] is None else f"{s['mean']:.4g}" if s["std"] is None
                    else f"{s['mean']:.4g} ± {s['std']:.2g}")
    return "\n".join([
        "# The main job over seeds (K-FAC at its phase-1 config against LAMB)", "",
        f"**K-FAC reached LAMB's final phase-1 held-out MLM loss in {summary['reached_lamb_final']} seeds.** "
        "Ratios are K-FAC's training seconds (or steps) to LAMB's final over LAMB's whole phase 1, and to LAMB's "
        "best over the seconds (or steps) LAMB needed to reach its best; "
        "cost per step is K-FAC's phase-1 training seconds per step over LAMB's; the SQuAD F1 is of K-FAC's model "
        "taken where its phase 1 stopped.", "",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in summary["settings"].items()), "",
        table([*rows, means], COLUMNS), "", "![held-out MLM loss, every seed](seeds_heldout.png)", ""])


def plot(summary: dict[str, Any], out: Path) -> None:
    """Held-out MLM loss against steps and against training seconds: one colour per seed, LAMB solid, K-FAC dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (seed, curves) in enumerate(sorted(summary["heldout_curves"].items())):
        for name, style in (("lamb", "-"), ("kfac", "--")):
            curve = curves.get(name) or {}
            label = f"seed {seed} {'LAMB' if name == 'lamb' else 'K-FAC'}"
            for ax, x in zip(axes, ("steps", "seconds")):
                ax.plot(curve.get(x, []), curve.get("values", []), style, color=f"C{i}", label=label)
    for ax, xlabel in zip(axes, ("optimizer step", "training seconds (evaluation excluded)")):
        ax.set(xlabel=xlabel, ylabel="held-out MLM loss", title="phase 1: held-out MLM loss")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mission_seeds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", type=Path, nargs="+", help="output folders of `python -m mission --seed N`")
    p.add_argument("--out", type=Path, required=True, help="where seeds.md, seeds.json and seeds_heldout.png go")
    args = p.parse_args(argv)
    try:
        summary = summarise(args.runs)
    except ValueError as e:  # runs that cannot be put side by side: a usage error, not a traceback
        p.error(str(e))
    text = markdown(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seeds.md").write_text(text)
    plot(summary, args.out / "seeds_heldout.png")
    write_json(summary, args.out / "seeds.json")
    print(text)
    print(f"wrote {args.out}/seeds.md, seeds.json and seeds_heldout.png")
    return summary


if __name__ == "__main__":
    main()
