"""LAMB's schedule shape and weight decay, tuned on the tune part at the learning rate and warmup its tuning chose.

Issue 23, 2b: every K-FAC ratio so far is against a LAMB tuned on learning rate and warmup only, with the shipped
PolyWarmUp degree (0.5: a square-root decay) and weight decay. A LAMB whose held-out loss rises late may only have
a bad schedule, so ``python -m benchmarks.convergence lamb-shape --regime R`` trains LAMB at each PolyWarmUp
``degree`` × ``weight_decay`` of the grid on the tune part, at the tuning length, and chooses the lowest mean final
held-out MLM loss over ``--seeds`` (the tuning seed by default), as the lr/warmup tuning chose. The grid point equal
to the shipped config is the lr/warmup tuning's own chosen run (reused). Records: ``<regime>/tune/*.json``;
summary ``<regime>/lamb_shape.json`` and the curves ``<regime>/lamb_shape.png``. The report part is not touched.

More LAMB keys can be added as axes (:data:`EXTRA_AXES`), each study writing a summary of its own beside the first:
``--nvlamb false true`` (Apex's NVLAMB, the trust ratio on every parameter: ``lamb_shape_nvlamb.json``),
``--max-grad-norms 1 0`` (the global-norm pre-normalisation threshold, 0: off; the control for K-FAC's runs with
``defaults --lamb-set max_grad_norm=0``: ``lamb_shape_max_grad_norm.json``) and ``--eps`` (Adam's epsilon, which
decides whether small gradients get Adam's per-element normalisation or a step proportional to them:
``lamb_shape_eps.json``).
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.convergence.plots import plot_curves
from benchmarks.convergence.regimes import Regime, shipped_lamb_shape
from benchmarks.convergence.runner import run, tune_spec
from benchmarks.harness.output import write_json

DEGREES = (0.5, 1.0)  # PolyWarmUp's decay after warmup: square root (shipped) or linear, as BERT's LAMB used
WEIGHT_DECAYS = (0.01, 0.1)  # the shipped value and ten times it (a late-rising held-out loss is overfitting)


# optional axes: the LAMB key, and the word its study's summary is named after
EXTRA_AXES = {"use_nvlamb": "nvlamb", "max_grad_norm": "max_grad_norm", "eps": "eps"}


def shape_settings(lamb: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    """LAMB's chosen lr and warmup with this shape; keys equal to the shipped config's are left out, so that point
    is the lr/warmup tuning's own run (same name and record)."""
    shipped = shipped_lamb_shape()
    return {"lr": lamb["lr"], "warmup": lamb["warmup"],
            **{key: value for key, value in shape.items() if value != shipped[key]}}


def lamb_shape(*, regime: Regime, parts: Any, chosen: dict[str, Any], seeds: list[int], vocab: Path, work: Path,
               out: Path, info: dict[str, Any], degrees: tuple[float, ...] = DEGREES,
               weight_decays: tuple[float, ...] = WEIGHT_DECAYS,
               extra_axes: dict[str, tuple[Any, ...]] | None = None) -> dict[str, Any]:
    """Run (or reuse) LAMB at every shape × seed on the tune part; choose the lowest mean final; write the summary
    and the plot. ``extra_axes``: more LAMB keys (of :data:`EXTRA_AXES`) and their values."""
    extra = dict(extra_axes or {})
    unknown = sorted(set(extra) - set(EXTRA_AXES))
    if unknown:
        raise ValueError(f"lamb-shape axes {unknown}: expected some of {sorted(EXTRA_AXES)}")
    lamb = chosen["lamb"]
    shipped = shipped_lamb_shape()
    axes: dict[str, tuple[Any, ...]] = {"degree": degrees, "weight_decay": weight_decays, **extra}
    points = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
    records: list[list[dict[str, Any]]] = [[] for _ in points]
    for (i, shape), seed in tqdm([(p, s) for p in enumerate(points) for s in seeds],
                                 desc=f"lamb-shape {regime.name}", unit="run"):
        spec = tune_spec(regime=regime, settings=shape_settings(lamb, shape), optimizer="lamb", seed=seed)
        records[i].append(run(spec, regime, parts, vocab=vocab, work=work,
                              record=out / "tune" / f"{spec.name}.json", machine=info))
    rows: list[dict[str, Any]] = []
    for shape, runs in zip(points, records):
        finals = [r["final"] for r in runs]
        done = [f for f in finals if f is not None]
        rows.append({**{key: shape.get(key, shipped[key]) for key in shipped}, "finals": finals,
                     "best": [min(r["curve"]["values"]) if r["curve"]["values"] else None for r in runs],
                     "mean_final": statistics.fmean(done) if len(done) == len(finals) else None,
                     "records": [f"tune/{r['spec']['name']}.json" for r in runs]})
    finished = [r for r in rows if r["mean_final"] is not None]
    if not finished:
        raise RuntimeError(f"lamb-shape {regime.name}: every run failed; see the records under {out / 'tune'}")
    best = min(finished, key=lambda r: r["mean_final"])
    choice = {key: best[key] for key in shipped}
    result = {"regime": regime.name, "part": "tune", "seeds": seeds, "lr": lamb["lr"], "warmup": lamb["warmup"],
              "shipped": shipped, "rows": rows, "chosen": choice, "changes_lamb": choice != shipped,
              "criterion": "lowest mean final held-out MLM loss on the tune part over the seeds", "machine": info}
    stem = "lamb_shape" + "".join(f"_{EXTRA_AXES[key]}" for key in extra)  # the first study's summary is kept
    result["written"] = [f"{stem}.json", f"{stem}.png"]
    write_json(result, out / f"{stem}.json")
    plot_curves({f"degree {p['degree']:g}, weight decay {p['weight_decay']:g}"
                 + "".join(f", {key} {p[key]}" for key in extra): runs for p, runs in zip(points, records)},
                title=f"LAMB's schedule shape, {regime.name} regime, tune part (lr {lamb['lr']:g}, warmup "
                      f"{lamb['warmup']:g}; seeds {seeds})",
                ylabel="held-out MLM loss (tune part)", out=out / f"{stem}.png")
    return result
