"""Side-by-side timing: a baseline model without K-FAC and identical copies with a K-FAC library each, on one
batch, timing every kind of step of a decomposition interval for real.

Each copy's forward+backward is timed right after a baseline forward+backward (and the baseline's optimizer step,
where there is one), so the hooks' cost is a difference of two adjacent timings and load that drifts over a run
falls on both. The step counter of each library is set to a step of the kind being measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol

import torch

from benchmarks.harness.interval import Interval
from benchmarks.harness.models import fwd_bwd
from benchmarks.harness.timing import timed


class Runner(Protocol):
    """One library's K-FAC on its own copy of the model, behind the few calls the benchmarks need."""

    name: str
    model: torch.nn.Module

    def set_step(self, step: int) -> None: ...

    def step(self) -> None: ...

    def stages(self) -> dict[str, float]: ...

    def layer_names(self) -> list[str]: ...

    def memory(self) -> dict[str, int]: ...


class KaisaRunner:
    """kaisa_ds's KFACPreconditioner (built by the benchmark with its settings); its own stage timer gives the
    stages: ``stage_names`` of them, or every one."""

    name = "kaisa_ds"

    def __init__(self, precond: Any, *, cuda: bool, stage_names: Sequence[str] | None = None) -> None:
        self.precond = precond
        self.model: torch.nn.Module = precond.model
        self.stage_names = stage_names
        precond.timer.sync = cuda

    def set_step(self, step: int) -> None:
        self.precond.steps = step  # the hooks read the step kind during forward+backward

    def step(self) -> None:
        self.precond.step()

    def stages(self) -> dict[str, float]:
        t = self.precond.timings
        return dict(t) if self.stage_names is None else {s: t[s] for s in self.stage_names}

    def layer_names(self) -> list[str]:
        return list(self.precond.layers)

    def memory(self) -> dict[str, int]:
        return dict(self.precond.memory_usage())


class SideBySide:
    """A baseline model and one copy per runner, sharing one batch; times each kind of step for each runner.

    ``optimizer`` (of the baseline model): its step is timed after each baseline forward+backward, then the
    baseline's weights are put back to the runner's, so that both models always compute the same thing.
    ``passes``: forward+backward passes per step (gradient accumulation); the runners' K-FAC must be told the same
    count (``accumulation_steps``) for pass sampling."""

    def __init__(self, *, base: torch.nn.Module, batch: dict[str, torch.Tensor], runners: Sequence[Runner],
                 interval: Interval, device: torch.device, autocast: torch.dtype | None = None,
                 optimizer: torch.optim.Optimizer | None = None, passes: int = 1) -> None:
        self.base, self.batch, self.runners, self.interval = base, batch, list(runners), interval
        self.passes = passes  # accumulated forward+backward passes per step (gradient accumulation)
        self.device = device
        self.cuda = device.type == "cuda"
        self.autocast = autocast
        self.optimizer = optimizer

    def fwd_bwd(self, model: torch.nn.Module) -> None:
        fwd_bwd(model, self.batch, autocast=self.autocast, passes=self.passes)

    @torch.no_grad()
    def _resync_baseline(self, model: torch.nn.Module) -> None:
        """Undo the optimizer step on the baseline's weights."""
        for base, same in zip(self.base.parameters(), model.parameters()):
            base.copy_(same)

    def round(self, kinds: list[str], *, first: int = 0) -> dict[str, dict[str, dict[str, float]]]:
        """Every kind of step once for each runner (``first`` goes first), each right after its own baseline
        forward+backward: per kind, per runner name, the raw seconds (``baseline_fwd_bwd``, ``optimizer_step``
        with an optimizer, ``fwd_bwd``, ``precond_step``) and the runner's stages."""
        order = self.runners[first:] + self.runners[:first]
        out: dict[str, dict[str, dict[str, float]]] = {}
        for kind in kinds:
            row: dict[str, dict[str, float]] = {}
            for runner in order:
                times = {"baseline_fwd_bwd": timed(partial(self.fwd_bwd, self.base), cuda=self.cuda)}
                if self.optimizer is not None:
                    times["optimizer_step"] = timed(self.optimizer.step, cuda=self.cuda)
                    self._resync_baseline(runner.model)
                runner.set_step(self.interval.step_number(kind))
                times["fwd_bwd"] = timed(partial(self.fwd_bwd, runner.model), cuda=self.cuda)
                times["precond_step"] = timed(runner.step, cuda=self.cuda)
                row[runner.name] = {**times, **runner.stages()}
            out[kind] = row
        return out
