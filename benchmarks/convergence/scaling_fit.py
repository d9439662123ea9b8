"""The scaling study's figures: steps and time to each target per batch and optimizer, the fit
``S(B) = S_min (1 + B_crit / B)`` (McCandlish et al. 2018; Shallue et al. 2019) with a bootstrap interval over
seeds, K-FAC's time to LAMB's final loss, its per-step overhead, and one plot a reader takes in at a glance."""

from __future__ import annotations

import json
import logging
import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.convergence import analysis
from benchmarks.convergence.scaling import Plan, Recorded, candidate_name, kfac_spec, lamb_spec, report_folder
from bert_pretrain.curves import Curve, first_crossing

logger = logging.getLogger(__name__)

BOOTSTRAP = 2000
OPTIMIZERS = ("lamb", "kfac")


def fit_critical_batch(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares of ``S = S_min + S_min·B_crit / B`` (linear in ``1/B``) over ``(batch, steps)`` points; returns
    ``(S_min, B_crit)``, or None with fewer than two batches or a non-positive ``S_min``."""
    if len({b for b, _ in points}) < 2:
        return None
    xs, ys = [1.0 / b for b, _ in points], [s for _, s in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    s_min = my - slope * mx
    return (s_min, slope / s_min) if s_min > 0 else None


def bootstrap_interval(by_batch: dict[int, list[float]], *, seed: int = 0) -> dict[str, Any]:
    """The fit on every seed's point, and a 95% percentile interval of ``B_crit`` from a residual bootstrap
    (``BOOTSTRAP`` draws): each point's relative residual from the fitted curve, pooled over all batches and widened
    by ``√(N / (N − 2))`` for the two fitted parameters, is redrawn onto the curve. Resampling the 2–3 seeds of each
    batch alone understates the spread (measured on synthetic points of known ``B_crit``: 75% coverage for a
    nominal 95%; this one: see the tests)."""
    points = [(float(b), s) for b, steps in by_batch.items() for s in steps]
    fitted = fit_critical_batch(points)
    if fitted is None or len(points) < 3 or any(s <= 0 for _, s in points):
        return {"s_min": fitted[0] if fitted else None, "b_crit_tokens": fitted[1] if fitted else None,
                "b_crit_interval": None, "valid_draws": 0, "draws": []}
    s_min, b_crit = fitted
    curve = [s_min * (1 + b_crit / b) for b, _ in points]
    if any(c <= 0 for c in curve):
        return {"s_min": s_min, "b_crit_tokens": b_crit, "b_crit_interval": None, "valid_draws": 0, "draws": []}
    widen = math.sqrt(len(points) / (len(points) - 2))
    residuals = [widen * math.log(s / c) for (_, s), c in zip(points, curve)]
    rng = random.Random(seed)
    draws = []
    for _ in range(BOOTSTRAP):
        got = fit_critical_batch([(b, c * math.exp(rng.choice(residuals))) for (b, _), c in zip(points, curve)])
        if got is not None:
            draws.append(got[1])
    return {"s_min": s_min, "b_crit_tokens": b_crit, "b_crit_interval": percentile_interval(draws),
            "valid_draws": len(draws), "draws": draws}


def percentile_interval(draws: Sequence[float]) -> list[float] | None:
    """The 2.5th and 97.5th percentiles of bootstrap draws (None with fewer than 40)."""
    ranked = sorted(draws)
    return [ranked[int(0.025 * len(ranked))], ranked[int(0.975 * len(ranked)) - 1]] if len(ranked) >= 40 else None


def ratio_interval(kfac: dict[str, Any], lamb: dict[str, Any]) -> dict[str, Any]:
    """K-FAC's critical batch over LAMB's, with the interval of the ratio of independent bootstrap draws."""
    if not kfac.get("b_crit_tokens") or not lamb.get("b_crit_tokens"):
        return {"ratio": None, "interval": None}
    pairs = [k / la for k, la in zip(kfac.get("draws", []), lamb.get("draws", [])) if la > 0]
    return {"ratio": kfac["b_crit_tokens"] / lamb["b_crit_tokens"], "interval": percentile_interval(pairs)}


def run_figures(record: dict[str, Any], *, targets: Sequence[float], tokens: int) -> dict[str, Any]:
    """One run's steps and training seconds to each target (None: not reached), cost per step, text reads."""
    curve = Curve(**record["curve"])
    steps = record["spec"]["steps"]
    out: dict[str, Any] = {"seed": record["spec"]["seed"], "final": record["final"],
                           "seconds_per_step": record["train_seconds"] / steps if record["train_seconds"] else None,
                           "reads_of_text": steps * tokens / record["data_tokens"] if record.get("data_tokens")
                           else None, "targets": {}}
    for target in targets:
        hit = first_crossing(curve, target)
        out["targets"][f"{target:.4f}"] = {"step": hit.step if hit else None, "seconds": hit.seconds if hit else None}
    return out


def load_batch(study: Recorded, plan: Plan, tokens: int) -> dict[str, list[dict[str, Any]]]:
    """The recorded report runs of one batch (missing runs are left out: the stage has not reached them)."""
    rule = study.rule
    regime = rule.regime_for(tokens, steps=plan.steps_at(tokens), model_size=study.model_size)
    chosen_path = study.results / regime.name / "chosen.json"
    if not chosen_path.is_file():
        return {"lamb": [], "kfac": []}
    lr = float(json.loads(chosen_path.read_text())["lamb"]["lr"])
    out: dict[str, list[dict[str, Any]]] = {"lamb": [], "kfac": []}
    for seed in rule.seeds_for(tokens, plan.batches, model_size=study.model_size):
        for name, spec in (("lamb", lamb_spec(regime, lr=lr, seed=seed, part="report")),
                           ("kfac", kfac_spec(regime, lr=lr, seed=seed))):
            path = report_folder(study.results, regime.name, study.candidate) / f"{spec.name}.json"
            record = json.loads(path.read_text()) if path.is_file() else None
            if record is not None and not math.isclose(float(record["spec"]["lr"]), lr, rel_tol=1e-6):
                logger.warning("%s: made at lr %s, not the batch's chosen %s (amendment 4 moved it): left out until "
                               "the report stage runs it again", path, record["spec"]["lr"], lr)
                record = None
            if record is not None and record.get("error") is None:
                out[name].append(record)
    return out


def fit_study(study: Recorded, plan: Plan, *, batches: Sequence[int]) -> dict[str, Any]:
    """Every batch's figures, the fits per optimizer and target, K-FAC's time to LAMB's final; writes
    ``summary.json`` and ``scaling.png`` into the study's results (``summary_<candidate>.json`` and
    ``scaling_<candidate>.png`` for a candidate's reruns)."""
    per_batch: dict[int, dict[str, Any]] = {}
    plateau = None
    for tokens in batches:
        records = load_batch(study, plan, tokens)
        if not records["lamb"]:
            continue
        if plateau is None:
            plateau = study.plateau(records["lamb"][0], "report")
        targets = [plateau - d for d in study.rule.target_drops]
        figures = {opt: [run_figures(r, targets=targets, tokens=tokens) for r in records[opt]] for opt in OPTIMIZERS}
        row: dict[str, Any] = {"runs": figures}
        if records["kfac"]:
            versus = analysis.compare(records["lamb"], records["kfac"], plateau_loss=plateau, targets=targets)
            row["kfac_to_lamb_final"] = versus["kfac_to_lamb_final"]
            lamb_cost = [f["seconds_per_step"] for f in figures["lamb"] if f["seconds_per_step"]]
            kfac_cost = [f["seconds_per_step"] for f in figures["kfac"] if f["seconds_per_step"]]
            row["kfac_step_overhead"] = (statistics.fmean(kfac_cost) / statistics.fmean(lamb_cost) - 1
                                         if lamb_cost and kfac_cost else None)
        per_batch[tokens] = row
    if plateau is None:
        raise SystemExit(f"no report runs recorded under {study.results}: run --stage report first")
    targets = [plateau - d for d in study.rule.target_drops]
    fits: dict[str, dict[str, Any]] = {}
    for opt in OPTIMIZERS:
        for target in targets:
            key = f"{target:.4f}"
            by_batch, left_out = {}, []
            for tokens, row in per_batch.items():
                steps = [f["targets"][key]["step"] for f in row["runs"][opt]]
                if steps and all(s is not None for s in steps):
                    by_batch[tokens] = [float(s) for s in steps]
                elif steps:
                    left_out.append(tokens)  # a seed never reached the target within the run: not fitted
            fits.setdefault(opt, {})[key] = {**bootstrap_interval(by_batch), "batches": sorted(by_batch),
                                             "not_reached_at": left_out}
    ratios = {key: ratio_interval(fits["kfac"][key], fits["lamb"][key]) for key in fits["lamb"]}
    for opt_fits in fits.values():
        for fit in opt_fits.values():
            del fit["draws"]  # 2,000 numbers each: the interval is what the record keeps
    summary = {"plateau": plateau, "targets": targets, "noise_tokens": plan.noise_tokens,
               "kfac_to_lamb_critical_batch": ratios,
               "per_batch": {str(k): v for k, v in per_batch.items()}, "fits": fits, "machine": study.machine}
    if study.candidate:
        summary["candidate"] = dict(study.candidate)
    suffix = f"_{candidate_name(study.candidate)}" if study.candidate else ""
    study.results.mkdir(parents=True, exist_ok=True)
    (study.results / f"summary{suffix}.json").write_text(json.dumps(summary, indent=1) + "\n")
    from benchmarks.convergence.scaling_plots import plot_scaling

    plot_scaling(summary, out=study.results / f"scaling{suffix}.png")
    return summary


def mean_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present and len(present) == len(values) else None

