"""LAMB's schedule shape and weight decay, tuned on the tune part at the learning rate and warmup its tuning chose.

Issue 23, 2b: every K-FAC ratio so far is against a LAMB tuned on learning rate and warmup only, with the shipped
PolyWarmUp degree (0.5: a square-root decay) and weight decay. A LAMB whose held-out loss rises late may only have
a bad schedule, so ``python -m benchmarks.convergence lamb-shape --regime R`` trains LAMB at each PolyWarmUp
``degree`` × ``weight_decay`` of the grid on the tune part, at the tuning length, and chooses the lowest mean final
held-out MLM loss over ``--seeds`` (the tuning seed by default), as the lr/warmup tuning chose. The grid point equal
to the shipped config is the lr/warmup tuning's own chosen run (reused). Records: ``<regime>/tune/*.json``;
summary ``<regime>/lamb_shape.json`` and the curves ``<regime>/lamb_shape.png``. The report part is not touched.
``--nvlamb false true`` adds Apex's NVLAMB (the trust ratio on every parameter, biases and LayerNorm included) as
an axis; that study writes ``lamb_shape_nvlamb.json`` / ``.png`` beside the first. ``--max-grad-norms 1 0`` adds
LAMB's global-norm pre-normalisation threshold (0: off) as an axis (``lamb_shape_max_grad_norm.json``): the control
for K-FAC's runs with ``defaults --lamb-set max_grad_norm=0``.
"""

from __future__ import annotations

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


def shape_settings(lamb: dict[str, Any], *, degree: float, weight_decay: float, use_nvlamb: bool = False,
                   max_grad_norm: float | None = None) -> dict[str, Any]:
    """LAMB's chosen lr and warmup with this shape; keys equal to the shipped config's are left out, so that point
    is the lr/warmup tuning's own run (same name and record). ``max_grad_norm`` None: the shipped one."""
    shipped = shipped_lamb_shape()
    settings = {"lr": lamb["lr"], "warmup": lamb["warmup"]}
    mgn = shipped["max_grad_norm"] if max_grad_norm is None else max_grad_norm
    for key, value in (("degree", degree), ("weight_decay", weight_decay), ("use_nvlamb", use_nvlamb),
                       ("max_grad_norm", mgn)):
        if value != shipped[key]:
            settings[key] = value
    return settings


def lamb_shape(*, regime: Regime, parts: Any, chosen: dict[str, Any], seeds: list[int], vocab: Path, work: Path,
               out: Path, info: dict[str, Any], degrees: tuple[float, ...] = DEGREES,
               weight_decays: tuple[float, ...] = WEIGHT_DECAYS,
               nvlambs: tuple[bool, ...] = (False,),
               max_grad_norms: tuple[float, ...] | None = None) -> dict[str, Any]:
    """Run (or reuse) LAMB at every shape × seed on the tune part; choose the lowest mean final; write the summary
    and the plot. ``max_grad_norms`` None: the shipped threshold only."""
    lamb = chosen["lamb"]
    shipped = shipped_lamb_shape()
    mgns = (shipped["max_grad_norm"],) if max_grad_norms is None else max_grad_norms
    points = [(d, w, n, m) for d in degrees for w in weight_decays for n in nvlambs for m in mgns]
    records: dict[tuple[float, float, bool, float], list[dict[str, Any]]] = {p: [] for p in points}
    for (degree, wd, nv, mgn), seed in tqdm([(p, s) for p in points for s in seeds],
                                            desc=f"lamb-shape {regime.name}", unit="run"):
        settings = shape_settings(lamb, degree=degree, weight_decay=wd, use_nvlamb=nv, max_grad_norm=mgn)
        spec = tune_spec(regime=regime, settings=settings, optimizer="lamb", seed=seed)
        records[(degree, wd, nv, mgn)].append(run(spec, regime, parts, vocab=vocab, work=work,
                                                  record=out / "tune" / f"{spec.name}.json", machine=info))
    rows: list[dict[str, Any]] = []
    for (degree, wd, nv, mgn), runs in records.items():
        finals = [r["final"] for r in runs]
        done = [f for f in finals if f is not None]
        rows.append({"degree": degree, "weight_decay": wd, "use_nvlamb": nv, "max_grad_norm": mgn, "finals": finals,
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
    # each extra axis writes a summary of its own, so the first study's choice is kept
    stem = "lamb_shape" + ("_nvlamb" if nvlambs != (False,) else "") + ("_max_grad_norm" if max_grad_norms else "")
    result["written"] = [f"{stem}.json", f"{stem}.png"]
    write_json(result, out / f"{stem}.json")
    plot_curves({f"degree {d:g}, weight decay {w:g}" + (", NVLAMB" if n else "")
                 + (f", max_grad_norm {m:g}" if max_grad_norms else ""): runs
                 for (d, w, n, m), runs in records.items()},
                title=f"LAMB's schedule shape, {regime.name} regime, tune part (lr {lamb['lr']:g}, warmup "
                      f"{lamb['warmup']:g}; seeds {seeds})",
                ylabel="held-out MLM loss (tune part)", out=out / f"{stem}.png")
    return result
