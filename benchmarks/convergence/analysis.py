"""From recorded runs to figures: the unigram plateau, the tuning choice, times to targets, seed statistics.

The plateau is the loss of the best context-free predictor: the entropy (nats) of the empirical distribution of the
masked target tokens that the evaluation scores. A model has learned something beyond token frequencies only once
its held-out MLM loss is clearly below it; a run "leaves the plateau" where its curve first reaches
plateau − ``PLATEAU_MARGIN``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bert_pretrain.curves import Curve, first_crossing

PLATEAU_MARGIN = 0.5  # nats below the plateau that count as having left it
WELL_BEFORE = 2 / 3  # LAMB must leave the plateau within this fraction of its run


def unigram_entropy(targets: Sequence[int]) -> float:
    """Entropy in nats of the empirical distribution of ``targets``."""
    counts: dict[int, int] = {}
    for t in targets:
        counts[t] = counts.get(t, 0) + 1
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no masked targets to compute the plateau from")
    return -sum(c / n * math.log(c / n) for c in counts.values())


def masked_targets(data: Any, *, examples: int | None = None) -> list[int]:
    """The masked target ids of the first ``examples`` examples of a prepared set (all of them: None)."""
    from bert_pretrain.data.examples import IGNORE

    if examples is not None:
        data = data.select(range(min(examples, len(data))))
    return [int(t) for row in data["masked_lm_ids"] for t in row.tolist() if int(t) != IGNORE]


def plateau(cache: Path, part: str) -> float:
    """Unigram entropy of all masked targets of the evaluation part ``part`` as prepared in ``cache``.

    All of the part's examples, not just the evaluated ones: the plug-in entropy of a small sample is biased low
    (every token seen once counts as certain), and that bias would move the plateau by tenths of a nat."""
    from bert_pretrain import eval_sets

    return unigram_entropy(masked_targets(eval_sets.load(eval_sets.folder(cache, part) / "phase1")))


def frequency_model_loss(cache: Path, part: str, *, examples: int) -> float:
    """Cross-entropy of the evaluated targets of ``part`` under the training part's target frequencies (add-½
    smoothing over the vocabulary): the held-out loss of a model that has learned token frequencies and nothing
    else, which is where training curves sit on the plateau. For context next to :func:`plateau`."""
    from bert_pretrain import eval_sets
    from bert_pretrain.data.loader import load_split

    train = masked_targets(load_split(cache / "phase1", "train"))
    evaluated = masked_targets(eval_sets.load(eval_sets.folder(cache, part) / "phase1"), examples=examples)
    vocab = len((cache / "vocab.txt").read_text(encoding="utf-8").splitlines())
    counts: dict[int, int] = {}
    for t in train:
        counts[t] = counts.get(t, 0) + 1
    total = len(train) + 0.5 * vocab
    return -statistics.fmean(math.log((counts.get(t, 0) + 0.5) / total) for t in evaluated)


def curve_of(record: dict[str, Any]) -> Curve:
    return Curve(**record["curve"])


def choose(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The tuning run with the lowest final held-out MLM loss on the tune part (the first of equals); failed
    (diverged) runs have no final loss and are never chosen."""
    parts = {r["spec"]["eval_part"] for r in records}
    if parts != {"tune"}:
        raise ValueError("tuning choices must read the tune part only, got runs evaluated on "
                         f"{sorted(parts or ['none'])}")
    finished = [r for r in records if r["final"] is not None]
    if not finished:
        raise ValueError("no finished tuning run to choose from")
    return min(finished, key=lambda r: r["final"])


def grid_edges(choice: dict[str, float], tried: Sequence[dict[str, float]]) -> list[str]:
    """Where the chosen point sits on an edge of the tried grid: along each of its settings, among the tried points
    equal to it in every other setting. A baseline chosen at an edge may be bettered outside the grid, so each
    edge is named with the flag that extends it (``tune --lamb-points LR:WARMUP``)."""
    edges = []
    for key, value in choice.items():
        line = sorted({p[key] for p in tried if all(p.get(k) == v for k, v in choice.items() if k != key)})
        if len(line) < 2:
            edges.append(f"{key} {value:g} is the only value tried at these settings: try others (--lamb-points)")
        elif value in (line[0], line[-1]):
            side = "smallest" if value == line[0] else "largest"
            edges.append(f"{key} {value:g} is the {side} tried ({line[0]:g}–{line[-1]:g}) at the chosen other "
                         "settings: a better point may lie beyond it (--lamb-points)")
    return edges


def run_summary(record: dict[str, Any], *, plateau_loss: float, targets: Sequence[float]) -> dict[str, Any]:
    """Final loss, where the run left the plateau, and when it reached each target (None: never)."""
    curve = curve_of(record)
    left = first_crossing(curve, plateau_loss - PLATEAU_MARGIN)
    out: dict[str, Any] = {"seed": record["spec"]["seed"], "final": record["final"], "failed": record.get("error"),
                           "train_seconds": record["train_seconds"], "steps": record["spec"]["steps"],
                           "plateau_exit_step": left.step if left else None,
                           "plateau_exit_seconds": left.seconds if left else None, "targets": {}}
    for target in targets:
        hit = first_crossing(curve, target)
        out["targets"][f"{target:.4f}"] = {"step": hit.step if hit else None, "seconds": hit.seconds if hit else None}
    return out


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean, sample standard deviation, min and max of the values present; how many were missing (None)."""
    present = [float(v) for v in values if v is not None]
    return {"mean": statistics.fmean(present) if present else None,
            "std": statistics.stdev(present) if len(present) > 1 else None,
            "min": min(present) if present else None, "max": max(present) if present else None,
            "n": len(present), "missing": len(values) - len(present)}


def compare(lamb: list[dict[str, Any]], kfac: list[dict[str, Any]], *, plateau_loss: float,
            targets: Sequence[float]) -> dict[str, Any]:
    """Seed-paired comparison on the report part: K-FAC's steps and training seconds to each seed's LAMB final loss
    (and as fractions of LAMB's run), both optimizers' times to the fixed targets, plateau exits."""
    for records in (lamb, kfac):
        parts = {r["spec"]["eval_part"] for r in records}
        if parts != {"report"}:
            raise ValueError(f"reported figures must come from the report part, got {sorted(parts)}")
    by_seed = {r["spec"]["seed"]: r for r in kfac}
    pairs = []
    for lr in sorted(lamb, key=lambda r: r["spec"]["seed"]):
        kr = by_seed.get(lr["spec"]["seed"])
        if kr is None:
            continue
        target = lr["final"]  # None when that LAMB run failed
        hit = first_crossing(curve_of(kr), target) if target is not None else None
        pairs.append({"seed": lr["spec"]["seed"], "lamb_final": target, "kfac_final": kr["final"],
                      "kfac_steps_to_lamb_final": hit.step if hit else None,
                      "kfac_seconds_to_lamb_final": hit.seconds if hit else None,
                      "lamb_train_seconds": lr["train_seconds"], "lamb_steps": lr["spec"]["steps"],
                      "step_ratio": hit.step / lr["spec"]["steps"] if hit else None,
                      "time_ratio": hit.seconds / lr["train_seconds"] if hit else None})
    runs = {name: [run_summary(r, plateau_loss=plateau_loss, targets=targets) for r in records]
            for name, records in (("lamb", lamb), ("kfac", kfac))}
    per_optimizer: dict[str, Any] = {}
    for name, summaries in runs.items():
        per_optimizer[name] = {
            "final": spread([s["final"] for s in summaries]),
            "train_seconds": spread([s["train_seconds"] for s in summaries]),
            "plateau_exit_step": spread([s["plateau_exit_step"] for s in summaries]),
            "targets": {t: {"step": spread([s["targets"][t]["step"] for s in summaries]),
                            "seconds": spread([s["targets"][t]["seconds"] for s in summaries])}
                        for t in (summaries[0]["targets"] if summaries else {})}}
    lamb_exits = [s["plateau_exit_step"] for s in runs["lamb"]]
    long_enough = bool(lamb_exits) and all(e is not None and e <= WELL_BEFORE * s["steps"]
                                           for e, s in zip(lamb_exits, runs["lamb"]))
    return {"plateau": plateau_loss, "plateau_margin": PLATEAU_MARGIN, "targets": list(targets),
            "runs": runs, "per_optimizer": per_optimizer, "pairs": pairs,
            "kfac_to_lamb_final": {"steps": spread([p["kfac_steps_to_lamb_final"] for p in pairs]),
                                   "seconds": spread([p["kfac_seconds_to_lamb_final"] for p in pairs]),
                                   "step_ratio": spread([p["step_ratio"] for p in pairs]),
                                   "time_ratio": spread([p["time_ratio"] for p in pairs])},
            "lamb_leaves_plateau_well_before_end": long_enough,
            "target_met": _target_met(pairs)}


def _target_met(pairs: list[dict[str, Any]]) -> bool:
    """K-FAC reaches LAMB's final loss in ≤ 0.7× LAMB's training time, mean over the seeds (every seed reaching it)."""
    ratios = [p["time_ratio"] for p in pairs]
    return bool(ratios) and all(r is not None for r in ratios) and statistics.fmean(ratios) <= 0.7
