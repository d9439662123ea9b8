"""One training run through the product's pipeline: ``bert_pretrain`` under the deepspeed launcher on 2 CPU ranks.

Each run trains on the training part only and is evaluated on exactly one other part (``tune`` while tuning,
``report`` for the final figures), so a tuning choice cannot see the report part and a reported figure cannot
come from the tuning part. Its record (settings, curve, the command) is written as JSON; a record already there
with the same settings (run and regime) and no error is reused, so an interrupted tuning sweep continues where it
stopped.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.convergence.parts import Parts
from benchmarks.convergence.regimes import Regime, ds_config
from bert_pretrain.curves import heldout_curve
from bert_pretrain.metrics import read_rows

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """What one run trains with; ``kfac`` holds the kfac-section keys (None: LAMB alone)."""

    name: str
    regime: str
    optimizer: str  # "lamb" or "kfac"
    lr: float
    warmup: float
    steps: int
    seed: int
    eval_part: str  # "tune" or "report"
    kfac: dict[str, Any] | None = None

    def key(self) -> dict[str, Any]:
        return asdict(self)


def train_args(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path, config: Path, out: Path,
               cache: Path) -> list[str]:
    """bert_pretrain's command line for this run."""
    return ["--phase", "1", "--config", str(config), "--output", str(out), "--max-steps", str(spec.steps),
            "--seed", str(spec.seed), "--data", str(parts.path("train")), "--vocab", str(vocab),
            "--model-size", regime.model_size, "--max-seq-length", str(regime.seq),
            "--max-predictions", str(regime.max_predictions), "--dupe-factor", str(regime.dupe_factor),
            "--eval-data", f"{spec.eval_part}={parts.path(spec.eval_part)}", "--eval-every", str(regime.eval_every),
            "--eval-examples", str(regime.eval_examples), "--save-every", "0", "--keep-checkpoints", "1",
            "--data-cache", str(cache)]


def run(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path, work: Path, record: Path,
        machine: dict[str, Any]) -> dict[str, Any]:
    """Train (or reuse the record of) one run; returns its record: settings, held-out curve, wall seconds."""
    if record.is_file():
        old = json.loads(record.read_text())
        same_regime = {k: old.get("regime", {}).get(k) for k in regime.run_key()} == regime.run_key()
        # a failed record is not reused: the failure may have been the machine's (a killed launcher, a broken
        # environment), and a diverging run fails again quickly
        if (old.get("spec") == spec.key() and old.get("parts_sha256") == parts.source_sha256 and same_regime
                and old.get("error") is None):
            logger.info("%s: recorded in %s; reused", spec.name, record)
            return dict(old)
    from mission.jobs import launch

    folder = work / spec.regime / spec.eval_part / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "ds_config.json"
    config.write_text(json.dumps(ds_config(regime, lr=spec.lr, warmup=spec.warmup, steps=spec.steps,
                                           kfac=spec.kfac), indent=1))
    # one data cache per seed (bert_pretrain's --seed also seeds the masking); the evaluation sets inside it are
    # prepared with a fixed seed, so every run is evaluated on the same examples
    cache = work / "data" / f"{regime.model_size}_seq{regime.seq}_seed{spec.seed}"
    # no valid record: whatever an earlier attempt left in the run folder is stale, so the run starts over
    args = [*train_args(spec, regime, parts, vocab=vocab, config=config, out=folder / "run", cache=cache),
            "--overwrite"]
    start = time.perf_counter()
    error = None
    try:
        launch("bert_pretrain", args, ranks=regime.ranks, log=folder / "train.log")
    except RuntimeError as exc:  # e.g. a diverged tuning run (non-finite loss): recorded as failed, not fatal
        error = str(exc)[-2000:]
        logger.warning("%s failed; recorded as failed (log: %s)", spec.name, folder / "train.log")
    wall = time.perf_counter() - start
    rows = read_rows(folder / "run" / "metrics.jsonl")
    curve = heldout_curve(rows, column=f"heldout_{spec.eval_part}_mlm_loss")
    if not curve.values and error is None:
        raise RuntimeError(f"{spec.name}: no heldout_{spec.eval_part}_mlm_loss in {folder / 'run' / 'metrics.jsonl'}")
    result = {"spec": spec.key(), "parts_sha256": parts.source_sha256, "regime": asdict(regime),
              "curve": asdict(curve), "final": None if error else curve.values[-1], "error": error,
              "train_seconds": float(rows[-1]["elapsed_s"]) if rows else None, "wall_seconds": round(wall, 1),
              "eval_cache": str(cache), "command": ["deepspeed", "--num_gpus", str(regime.ranks), "--module",
                                                   "bert_pretrain", *args], "machine": machine}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(result, indent=1) + "\n")
    return result
