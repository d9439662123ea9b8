"""Predicted K-FAC time per step from measured rates: statistics and preconditioning GEMMs, decompositions,
and (with a bandwidth) the collectives; amortised over the factor and decomposition intervals.

Rates come from flags or from the calibration that ``python -m benchmarks.step_cost`` writes (its JSON's
``calibration`` object: ``gemm_gflops``, ``eigh_seconds`` and ``inverse_seconds`` per factor size, and the
measured ``baseline_step_s`` with the ``settings`` it was measured at). A decomposition of size n takes the
measured time at the nearest calibrated size m, times (n/m)³. Every rank waits for the slowest rank at the
broadcasts, so decomposition and preconditioning count the busiest rank.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kaisa_ds.decomposition.registry import method_for
from kaisa_ds.enums import ComputeMethod


@dataclass(frozen=True)
class Rates:
    gemm_gflops: float
    eigh_seconds: dict[int, float] = field(default_factory=dict)
    inverse_seconds: dict[int, float] = field(default_factory=dict)
    step_seconds: float | None = None  # a measured baseline step (forward+backward+optimizer) of this run
    network_gbps: float | None = None  # per-rank bandwidth for the collectives (None: not counted)

    def decomposition_seconds(self, n: int, *, diagonal: bool, method: ComputeMethod) -> float:
        """The method's predicted time for one factor of size ``n`` (a diagonal one is a negligible vector op)."""
        return 0.0 if diagonal else method_for(method).seconds(n, rates=self)

    def gemm_seconds(self, flops: float) -> float:
        return flops / (self.gemm_gflops * 1e9)

    def baseline_seconds(self, baseline_flops: float | None) -> float | None:
        """The step K-FAC is added to: the measured one, else the model's flops at the GEMM rate (None: neither)."""
        if self.step_seconds is not None:
            return self.step_seconds
        return self.gemm_seconds(baseline_flops) if baseline_flops else None

    def wire_seconds(self, nbytes: float) -> float:
        return 0.0 if self.network_gbps is None else nbytes * 8 / (self.network_gbps * 1e9)


def read_calibration(path: Path) -> dict[str, Any]:
    """The ``calibration`` object of a step_cost JSON (or a file holding just that object)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--calibration {path}: cannot read it as JSON ({exc})") from exc
    cal = data.get("calibration", data)
    if not isinstance(cal, dict) or "gemm_gflops" not in cal:
        raise ValueError(f"--calibration {path}: no 'calibration' object with 'gemm_gflops'; write one with "
                         "python -m benchmarks.step_cost (its JSON output)")
    return cal


def rates_from(calibration: Mapping[str, Any] | None, *, gemm_gflops: float | None,
               eigh_seconds: Mapping[int, float], inverse_seconds: Mapping[int, float],
               step_seconds: float | None, network_gbps: float | None) -> Rates | None:
    """Flags over the calibration file; None when no GEMM rate is known (no prediction then)."""
    cal = dict(calibration or {})
    gemm = gemm_gflops if gemm_gflops is not None else cal.get("gemm_gflops")
    if gemm is None:
        return None
    eigh = {int(k): float(v) for k, v in cal.get("eigh_seconds", {}).items()} | dict(eigh_seconds)
    inv = {int(k): float(v) for k, v in cal.get("inverse_seconds", {}).items()} | dict(inverse_seconds)
    return Rates(gemm_gflops=float(gemm), eigh_seconds=eigh, inverse_seconds=inv, step_seconds=step_seconds,
                 network_gbps=network_gbps)


def bert_step_flops(cfg: Any, *, micro_batch: int, seq: int, passes: int, shapes: Any = None) -> float:
    """Forward+backward FLOPs of a BERT pretraining step (3× forward: encoder GEMMs, attention scores and the
    MLM head at 15% of the positions); the baseline the overhead is a share of when no step time is given."""
    h, inter, layers, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    tokens = micro_batch * seq
    encoder = 2 * tokens * layers * (4 * h * h + 2 * h * inter) + 4 * micro_batch * seq * seq * h * layers
    head = 2 * math.ceil(0.15 * tokens) * (h * h + h * vocab)
    return 3.0 * (encoder + head) * passes


def transformer_step_flops(cfg: Any, *, micro_batch: int, seq: int, passes: int, shapes: Any) -> float:
    """Forward+backward FLOPs of any transformer's step from its K-FAC layers' shapes: ``6 · tokens ·`` the weights
    of its preconditioned layers (embedding tables cost no GEMM), a floor that leaves attention scores out."""
    weights = sum(ly.out * ly.inp for ly in shapes.layers.values() if not ly.embedding)
    return 6.0 * micro_batch * seq * weights * passes
