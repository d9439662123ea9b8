"""What a person tuning K-FAC needs to see per step, gathered without host syncs on the hot path.

Per decomposition, per layer group: the share of the gradient on which damping outweighs the curvature (damping
share, gradient-weighted) and the cosine between the preconditioned and the raw gradient
(:mod:`kaisa_ds.precondition.effectiveness`), and the layers left unpreconditioned.

The KL-clip scale ν and the eigenvalue ranges stay tensors until :meth:`Diagnostics.snapshot` is called (on a
reporting step), so recording them costs nothing on the other steps. Layers are grouped by their name with
the layer index removed (``bert.encoder.layer.*.attention.self.query``), which is how a person reads a model.
Consecutive decomposition failures of one factor are counted so that a factor that never decomposes again
stops the run with a clear error instead of preconditioning with a stale decomposition forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kaisa_ds.enums import DampingMode, Eigenvalues
from kaisa_ds.layers.groups import layer_group
from kaisa_ds.layers.noise_scale import NoiseScale


class DecompositionFailed(RuntimeError):
    """One factor failed to decompose more often in a row than ``max_decomposition_failures`` allows."""


@dataclass
class Diagnostics:
    """Per-step values in force and per-decomposition eigenvalue ranges."""

    kl_scale: torch.Tensor | None = None  # ν of the last step (None: KL clip off or nothing preconditioned)
    damping: float = 0.0
    lr: float = 0.0
    last_decomposition_step: int | None = None
    failed_decompositions: int = 0  # in total
    consecutive_failures: dict[str, int] = field(default_factory=dict)
    eigen_ranges: dict[str, torch.Tensor] = field(default_factory=dict)  # group.A|G -> (min, max) tensor
    damping_mode: DampingMode = DampingMode.RELATIVE
    effectiveness_due: bool = False  # set by a decomposition; the step's preconditioning then measures
    effectiveness: dict[str, dict[str, float]] = field(default_factory=dict)  # group -> damping_share, cosine
    unpreconditioned: list[str] = field(default_factory=list)  # layers the last measurement could not precondition
    warned: set[str] = field(default_factory=set)  # kinds of effectiveness warnings already logged
    coverage: dict[str, Any] | None = None  # what share of the model is preconditioned (set at the first step)
    method_report: dict[str, float] = field(default_factory=dict)  # what the last decomposition round did (this rank)
    eigenvalues: Eigenvalues = Eigenvalues.KRONECKER  # in force: under "adaptive" no damping is applied

    def record_step(self, *, kl_scale: torch.Tensor | None, damping: float, lr: float,
                    damping_mode: DampingMode) -> None:
        self.kl_scale, self.damping, self.lr, self.damping_mode = kl_scale, damping, lr, damping_mode

    def record_effectiveness(self, figures: dict[str, tuple[float, float] | None], *, empty: list[str],
                             warned: set[str]) -> None:
        """Per layer (damping share, cosine to the raw gradient), or None where it was not preconditioned; kept
        as the mean per layer group (see :mod:`kaisa_ds.precondition.effectiveness`). ``warned``: the kinds of
        warning just logged (each is logged once per run)."""
        by_group: dict[str, list[tuple[float, float]]] = {}
        for name, fig in figures.items():
            if fig is not None:
                by_group.setdefault(layer_group(name), []).append(fig)
        self.effectiveness = {g: {"damping_share": sum(f[0] for f in fs) / len(fs),
                                  "cosine": sum(f[1] for f in fs) / len(fs)} for g, fs in by_group.items()}
        self.unpreconditioned = sorted(set(empty) | {n for n, f in figures.items() if f is None})
        self.warned |= warned
        self.effectiveness_due = False

    def record_decompositions(self, step: int, *, tried: list[str], failed: list[str]) -> None:
        """After a decomposition step: the factors this rank ``tried`` and the ones that ``failed``."""
        self.last_decomposition_step = step
        self.failed_decompositions += len(failed)
        for name in tried:
            self.consecutive_failures[name] = self.consecutive_failures.get(name, 0) + 1 if name in failed else 0

    def record_refresh(self, eigvals: dict[str, tuple[str, torch.Tensor]]) -> None:
        """After new decompositions are in place: the step's preconditioning measures their effectiveness, and
        ``{factor: (layer group label, eigenvalues)}`` of the decompositions this rank holds → min/max per label
        (tensors; no host sync here)."""
        self.effectiveness_due = True
        by_group: dict[str, list[torch.Tensor]] = {}
        for label, values in eigvals.values():
            by_group.setdefault(label, []).append(torch.stack([values.min(), values.max()]).float())
        self.eigen_ranges = {}
        for label, ranges in by_group.items():
            stacked = torch.stack(ranges)
            self.eigen_ranges[label] = torch.stack([stacked[:, 0].min(), stacked[:, 1].max()])

    def worst_failure(self) -> tuple[str | None, int]:
        if not self.consecutive_failures:
            return None, 0
        name = max(self.consecutive_failures, key=lambda n: self.consecutive_failures[n])
        return name, self.consecutive_failures[name]

    def snapshot(self, step: int, *, skipped_windows: int, noise: NoiseScale | None = None) -> dict[str, Any]:
        """Plain numbers for metrics.jsonl and DeepSpeed's monitor (one host sync): ν, the eigenvalue scaling,
        damping (and its mode; None under adaptive eigenvalues, which apply none) and lr in force, decomposition
        age, skipped/failed counts, min/max eigenvalues per layer group held here, the last decomposition's
        effectiveness check and round, the coverage, and the gradient noise scale."""
        ranges = {k: [float(x) for x in v.tolist()] for k, v in self.eigen_ranges.items()}
        b_simple = None if noise is None else noise.b_simple()
        return {
            "kl_scale": None if self.kl_scale is None else float(self.kl_scale),
            "eigenvalue_scaling": self.eigenvalues.value, "lr": self.lr,
            "damping": self.damping if self.eigenvalues is Eigenvalues.KRONECKER else None,
            "damping_mode": self.damping_mode.value if self.eigenvalues is Eigenvalues.KRONECKER else None,
            "decomposition_age": None if self.last_decomposition_step is None else step - self.last_decomposition_step,
            "skipped_windows": skipped_windows, "failed_decompositions": self.failed_decompositions,
            "eigenvalues": {k: {"min": v[0], "max": v[1]} for k, v in ranges.items()},
            "effectiveness": {k: dict(v) for k, v in self.effectiveness.items()},
            "unpreconditioned_layers": list(self.unpreconditioned),
            "coverage": self.coverage,
            "decomposition_round": dict(self.method_report),
            "noise_scale": None if noise is None or b_simple is None else {
                "b_simple": b_simple, **noise.last},  # in samples (the batch dimension), per step
        }
