"""Reports K-FAC stage timings and memory through DeepSpeed's monitor and logging."""

from __future__ import annotations

import logging
from typing import Any

from kaisa_ds.preconditioner import KFACPreconditioner

logger = logging.getLogger(__name__)


def kfac_events(kfac: KFACPreconditioner, samples: int) -> list[tuple[str, float, int]]:
    """(name, value, x) events for ``engine.monitor.write_events``: ms per stage, MB of memory, skipped windows,
    and per layer group the effectiveness check's damping share and cosine to the raw gradient."""
    events = [(f"Train/KFAC/{stage}_ms", seconds * 1000.0, samples) for stage, seconds in kfac.timings.items()]
    events += [(f"Train/KFAC/{kind}_MB", nbytes / 2**20, samples) for kind, nbytes in kfac.memory_usage().items()]
    diag = kfac.diagnostics_snapshot()
    for key in ("kl_scale", "damping", "decomposition_age", "skipped_windows", "failed_decompositions",
                "inv_update_steps"):
        if diag[key] is not None:
            events.append((f"Train/KFAC/{key}", float(diag[key]), samples))
    for group, bounds in diag["eigenvalues"].items():
        events += [(f"Train/KFAC/eigenvalue_{which}/{group}", value, samples) for which, value in bounds.items()]
    for group, figures in diag["effectiveness"].items():
        events += [(f"Train/KFAC/{key}/{group}", value, samples) for key, value in figures.items()]
    events.append(("Train/KFAC/unpreconditioned_layers", float(len(diag["unpreconditioned_layers"])), samples))
    if diag.get("noise_scale"):
        events += [("Train/KFAC/noise_scale_b_simple", float(diag["noise_scale"]["b_simple"]), samples),
                   ("Train/KFAC/noise_scale_batch", float(diag["noise_scale"]["samples_per_step"]), samples)]
    if diag.get("coverage"):
        events += [(f"Train/KFAC/coverage_{key}", float(diag["coverage"][key]), samples)
                   for key in ("share", "linear_share")]
    return events


def report(engine: Any, kfac: KFACPreconditioner) -> None:
    """Log one line and write the monitor events (on the ranks where DeepSpeed's monitor is enabled)."""
    samples = int(getattr(engine, "global_samples", 0))
    events = kfac_events(kfac, samples)
    monitor = getattr(engine, "monitor", None)
    if monitor is not None and getattr(monitor, "enabled", False):
        monitor.write_events(events)
    if kfac.rank == 0:
        logger.info("K-FAC step %d: %s", kfac.steps,
                    ", ".join(f"{n.split('/')[-1]}={v:.2f}" for n, v, _ in events))
