"""What a user gets by turning K-FAC on: the library's defaults at LAMB's tuned learning rate, no K-FAC tuning.

``python -m benchmarks.convergence defaults --regime large`` trains K-FAC with the kfac section
``{"enabled": true}`` and nothing else (every option at the library's default: damping, intervals, statistics,
KL clip, factor decay), at the learning rate and warmup LAMB's tuning chose, on the report part, with the final
runs' seeds; the final LAMB and tuned-K-FAC records are reused. Figures per seed, as the ablation reports them:
final loss, steps and training seconds to LAMB's *final* and to LAMB's *best* held-out loss, as fractions of LAMB's
run. Records: ``<results>/<regime>/defaults/*.json`` and ``defaults.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.convergence.ablation import seed_rows, summarise
from benchmarks.convergence.regimes import LIBRARY_DEFAULTS
from benchmarks.convergence.runner import RunSpec, run


def defaults(*, regime: Any, parts: Any, chosen: dict[str, Any], seeds: list[int], vocab: Path, work: Path,
             out: Path, info: dict[str, Any], kfac_keys: Any) -> dict[str, Any]:
    """Run (or reuse) LAMB, the tuned K-FAC and K-FAC at the library's defaults; write ``defaults.json``."""
    records: dict[str, list[dict[str, Any]]] = {"lamb": [], "tuned": [], "defaults": []}
    lamb = chosen["lamb"]
    for seed, name in tqdm([(s, n) for s in seeds for n in records], desc=f"defaults {regime.name}", unit="run"):
        if name == "defaults":
            spec = RunSpec(name=f"defaults_seed{seed}", regime=regime.name, optimizer=LIBRARY_DEFAULTS,
                           lr=lamb["lr"], warmup=lamb["warmup"], steps=regime.steps, seed=seed,
                           eval_part="report", kfac={})
            record = out / "defaults" / f"{spec.name}.json"
        else:
            s = chosen["lamb" if name == "lamb" else "kfac"]
            spec = RunSpec(name=f"{'lamb' if name == 'lamb' else 'kfac'}_seed{seed}", regime=regime.name,
                           optimizer="lamb" if name == "lamb" else "kfac", lr=s["lr"], warmup=s["warmup"],
                           steps=regime.steps, seed=seed, eval_part="report",
                           kfac=None if name == "lamb" else {**kfac_keys(s), **dict(regime.final_kfac)})
            record = out / "final" / f"{spec.name}.json"
        records[name].append(run(spec, regime, parts, vocab=vocab, work=work, record=record, machine=info))
    rows = seed_rows(records["lamb"], {"tuned": records["tuned"], "defaults": records["defaults"]})
    result = {"regime": regime.name, "seeds": seeds, "lamb": lamb, "tuned_kfac": chosen["kfac"],
              "final_kfac": dict(regime.final_kfac), "defaults_kfac_section": {"enabled": True},
              "defaults_lr": lamb["lr"], "defaults_warmup": lamb["warmup"], "rows": rows,
              "summary": summarise(rows), "machine": info}
    (out / "defaults.json").write_text(json.dumps(result, indent=1) + "\n")
    return result

