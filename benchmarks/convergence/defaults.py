"""What a user gets by turning K-FAC on: the library's defaults at LAMB's tuned learning rate, no K-FAC tuning.

``python -m benchmarks.convergence defaults --regime large`` trains K-FAC with the kfac section
``{"enabled": true}`` and nothing else (every option at the library's default: damping, intervals, statistics,
KL clip, factor decay), at the learning rate and warmup LAMB's tuning chose, on the report part, with the final
runs' seeds; the final LAMB and tuned-K-FAC records are reused. Figures per seed, as the ablation reports them:
final loss, steps and training seconds to LAMB's *final* and to LAMB's *best* held-out loss, as fractions of LAMB's
run. Records: ``<results>/<regime>/defaults/*.json``, ``defaults.json`` and the curves in ``defaults.png``.

Choosing new defaults happens on the tune part only: ``--part tune --set KEY=VALUE ...`` trains the section
``{"enabled": true, KEY: VALUE, ...}`` at the tuning length, with the tuning seed (or ``--seeds``), beside LAMB's
chosen tuning settings at the same seeds (the tuning seed's run is reused), into
``<regime>/defaults_tune/`` and ``defaults_tune.json``; the report part is never touched by it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.convergence.ablation import seed_rows, summarise
from benchmarks.convergence.plots import plot_curves
from benchmarks.convergence.regimes import LIBRARY_DEFAULTS
from benchmarks.convergence.runner import RunSpec, final_spec, run, tune_spec


def _plain(value: Any) -> str:
    """A setting's value in a file name: numbers as ``%g``, lists joined by ``+`` (no brackets, quotes, spaces)."""
    if isinstance(value, (int, float)):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "+".join(_plain(v) for v in value)
    return str(value)


def candidate_name(extra: dict[str, Any], lamb_shape: dict[str, Any] | None = None) -> str:
    """``defaults`` plus the keys set on top of ``{"enabled": true}`` (and the LAMB keys changed under it), as a
    record name."""
    return ("defaults" + "".join(f"_{k}{_plain(v)}" for k, v in sorted(extra.items()))
            + "".join(f"_lamb_{k}{_plain(v)}" for k, v in sorted((lamb_shape or {}).items())))


def defaults_spec(*, regime: Any, lamb: dict[str, Any], seed: int, steps: int, part: str = "report",
                  extra: dict[str, Any] | None = None, lamb_shape: dict[str, Any] | None = None) -> RunSpec:
    """K-FAC with the section ``{"enabled": true, **extra}`` at LAMB's chosen learning rate and warmup (and with
    ``lamb_shape``'s LAMB keys, an ablation of how K-FAC meets LAMB)."""
    extra = dict(extra or {})
    return RunSpec(name=f"{candidate_name(extra, lamb_shape)}_seed{seed}", regime=regime.name,
                   optimizer=LIBRARY_DEFAULTS, lr=lamb["lr"], warmup=lamb["warmup"], steps=steps, seed=seed,
                   eval_part=part, kfac=extra, lamb_shape=dict(lamb_shape) if lamb_shape else None)


def defaults(*, regime: Any, parts: Any, chosen: dict[str, Any], seeds: list[int], vocab: Path, work: Path,
             out: Path, info: dict[str, Any], part: str = "report",
             extra: dict[str, Any] | None = None, lamb_shape: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run (or reuse) LAMB, the tuned K-FAC (report part only) and K-FAC at the library's defaults (with
    ``extra`` keys set, and ``lamb_shape``'s LAMB keys under it); write ``defaults.json`` (``defaults_tune.json``
    for the tune part)."""
    extra = dict(extra or {})
    tune = part == "tune"
    steps = regime.tune_steps if tune else regime.steps
    folder = out / ("defaults_tune" if tune else "defaults")
    # without a tuned K-FAC (``tune --lamb-only``) the report part holds LAMB and the defaults only
    names = ["lamb", "defaults"] if tune or chosen.get("kfac") is None else ["lamb", "tuned", "defaults"]
    records: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    lamb = chosen["lamb"]
    for seed, name in tqdm([(s, n) for s in seeds for n in names], desc=f"defaults {regime.name} {part}", unit="run"):
        if name == "defaults":
            spec = defaults_spec(regime=regime, lamb=lamb, seed=seed, steps=steps, part=part, extra=extra,
                                 lamb_shape=lamb_shape)
            record = folder / f"{spec.name}.json"
        elif name == "lamb" and tune:  # the chosen LAMB tuning run, under the name tune gave it
            spec = tune_spec(regime=regime, settings=lamb, optimizer="lamb", seed=seed)
            record = out / "tune" / f"{spec.name}.json"
        else:  # LAMB's and the tuned K-FAC's final runs (report part)
            spec = final_spec(regime=regime, chosen=chosen, optimizer="lamb" if name == "lamb" else "kfac", seed=seed)
            record = out / "final" / f"{spec.name}.json"
        records[name].append(run(spec, regime, parts, vocab=vocab, work=work, record=record, machine=info))
    rows = seed_rows(records["lamb"], {n: records[n] for n in names if n != "lamb"})
    result = {"regime": regime.name, "model_size": regime.model_size, "part": part, "seeds": seeds, "lamb": lamb,
              "tuned_kfac": chosen.get("kfac"),
              "final_kfac": dict(regime.final_kfac), "defaults_kfac_section": {"enabled": True, **extra},
              "defaults_lr": lamb["lr"], "defaults_warmup": lamb["warmup"], "rows": rows,
              "summary": summarise(rows), "machine": info}
    if not tune:
        labels = {"lamb": "LAMB (tuned lr, warmup)", "tuned": "K-FAC tuned", "defaults": "K-FAC defaults"}
        plot_curves({labels[n]: records[n] for n in names}, out=out / "defaults.png", ylabel="held-out MLM loss",
                    title=f"{regime.name} regime (BERT-{regime.model_size}), report part: "
                          f"{', '.join(labels[n] for n in names)}; seeds {seeds}")
    written = out / ("defaults_tune.json" if tune else "defaults.json")
    if tune:  # one file for every candidate tried on the tune part
        earlier = json.loads(written.read_text()) if written.is_file() else {}
        result = {**earlier, candidate_name(extra, lamb_shape): result}
    written.write_text(json.dumps(result, indent=1) + "\n")
    return result if not tune else result[candidate_name(extra, lamb_shape)]


def kfac_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as JSON where it parses (numbers, true, lists), else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. factor_update_steps=5")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
