"""A diagnostic of the scaling study (docs/studies/batch_scaling.md, amendment 6): K-FAC's defaults at a batch, on the
tune part and the tuning seed, at LAMB's chosen rate times a factor and with kfac keys set, to find *why* K-FAC does
what the report shows. It is never a choice: no report figure, fit or default reads these runs.

Each run is recorded beside LAMB's grid (``b<tokens>/tune/kfac_defaults_<what it changed>.json``) and compared there
with LAMB's tune runs on the same data and seed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from benchmarks.convergence.regimes import Regime
from benchmarks.convergence.runner import TUNE_SEED, RunSpec
from benchmarks.convergence.scaling import Study, candidate_name, kfac_spec


def probe_name(*, lr_scale: float, kfac: dict[str, Any]) -> str:
    """The record's name: what the probe changed from ``{"enabled": true}`` at LAMB's rate."""
    changes = [f"lrx{lr_scale:g}"] if lr_scale != 1.0 else []
    changes += [candidate_name(kfac)] if kfac else []
    return "kfac_defaults" + "".join(f"_{c}" for c in changes)


def read_chosen(folder: Path, *, run_tune: str) -> dict[str, Any]:
    """LAMB's choice at a batch (``chosen.json``: its rate and the tune grid's finals), which probes run against."""
    path = folder / "chosen.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: probes run at LAMB's chosen rate; run {run_tune}")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def probe_spec(regime: Regime, *, lamb_lr: float, lr_scale: float, kfac: dict[str, Any]) -> RunSpec:
    """K-FAC with only ``kfac``'s keys set, at ``lamb_lr × lr_scale``, on the tune part with the tuning seed."""
    report_twin = kfac_spec(regime, lr=round(lamb_lr * lr_scale, 9), seed=TUNE_SEED)
    return dataclasses.replace(report_twin, name=probe_name(lr_scale=lr_scale, kfac=kfac), eval_part="tune",
                               kfac=dict(kfac))


def probe(study: Study, regime: Regime, *, lr_scale: float = 1.0, kfac: dict[str, Any] | None = None,
          ) -> dict[str, Any]:
    """Run (or reuse) one probe and set it beside LAMB's tune runs at the batch: their finals, same data, same seed."""
    if lr_scale <= 0:
        raise SystemExit(f"--kfac-lr-scale {lr_scale}: a rate factor must be positive")
    chosen = read_chosen(study.results / regime.name, run_tune="--stage tune for this batch")
    lamb_lr = float(chosen["lamb"]["lr"])
    record = study.run(probe_spec(regime, lamb_lr=lamb_lr, lr_scale=lr_scale, kfac=kfac or {}), regime)
    return {"probe": record["spec"]["name"], "lr": record["spec"]["lr"], "final": record["final"],
            "kfac_interval": record.get("kfac_interval"), "lamb_lr": lamb_lr, "lamb_finals": chosen["finals"]}
