"""KFACPreconditioner: wires capture → factors → decomposition → communication → preconditioning."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from kaisa_ds.capture.hooks import HookCapture
from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.decompose import Decomposition
from kaisa_ds.distributed.assignment import Assignment, WorkUnit, assign_work, resolve_grad_workers
from kaisa_ds.distributed.collectives import rank, world_size
from kaisa_ds.distributed.kaisa import KAISACommunicator
from kaisa_ds.enums import LossReduction
from kaisa_ds.factors.factor import KroneckerFactor
from kaisa_ds.factors.modules import GradAccessor, ParamGradAccessor
from kaisa_ds.layers import KFACLayer, discover_layers, share_inputs
from kaisa_ds.state import export_state, import_state
from kaisa_ds.step import STAGES, run_step
from kaisa_ds.timing import StageTimer

logger = logging.getLogger(__name__)


class KFACPreconditioner:
    """Distributed K-FAC gradient preconditioner (KAISA). Call :meth:`step` after the gradients are
    complete (reduced across ranks) and before ``optimizer.step()``.

    Options are :class:`~kaisa_ds.config.KFACConfig` fields, as keywords or as ``config=``
    (keywords win). ``grad_accessor`` says where gradients live (default ``param.grad``).
    """

    def __init__(self, model: nn.Module, *, config: KFACConfig | None = None,
                 grad_accessor: GradAccessor | None = None, **options: Any) -> None:
        if config is not None and options:
            config = KFACConfig(**{**{k: getattr(config, k) for k in config.__dataclass_fields__
                                      if not k.startswith("_")}, **options})
        self.config = config if config is not None else KFACConfig(**options)
        self.model = model
        self.grads = grad_accessor or ParamGradAccessor()
        self.layers: dict[str, KFACLayer] = discover_layers(model, self.config)
        self.world, self.rank = world_size(), rank()
        self.grad_workers = resolve_grad_workers(self.config.grad_worker_fraction, self.world)  # type: ignore[arg-type]
        self.steps = 0
        self.skipped_windows = 0
        self.decompositions: dict[str, Decomposition] = {}
        self.assignment: Assignment | None = None
        self._comm: KAISACommunicator | None = None
        self._pending_decompositions: dict[str, Decomposition] | None = None
        self.timer = StageTimer()
        self._capture_cache: tuple[int, bool] = (-1, False)
        self.comm_bytes: dict[str, int] = {}
        self._decompositions_stale = False
        self._unit_factors: dict[str, list[str]] = {}
        self._unit_layers: dict[str, list[str]] = {}
        self.capture = HookCapture(enabled=self._capturing, on_input=self._on_input, on_output_grad=self._on_grad)
        for name, layer in self.layers.items():
            self.capture.attach(name, layer.module)
        self._discovered_info: dict[str, dict[str, Any]] = {}

    # ---------------------------------------------------------------- capture
    def _capturing(self) -> bool:
        """Whether the current window updates factors (cached per step: hooks ask once per layer)."""
        if self._capture_cache[0] != self.steps:
            self._capture_cache = (self.steps, self.steps % self.config.value("factor_update_steps", self.steps) == 0)
        return self._capture_cache[1]

    def _loss_scale(self) -> float:
        return float(self.config.loss_scale()) if self.config.loss_scale is not None else 1.0

    def _on_input(self, name: str, inp: torch.Tensor) -> None:
        layer = self.layers.get(name)
        if layer is None or layer.a.already_counted(inp):
            return  # a shared A factor already counted this very tensor
        layer.a.add(*layer.helper.a_statistic(inp))
        layer.a.mark_counted(inp)

    def _on_grad(self, name: str, grad: torch.Tensor) -> None:
        layer = self.layers.get(name)
        if layer is None:
            return
        stat, count = layer.helper.g_statistic(grad)
        per_sample = grad.shape[0] if self.config.loss_reduction is LossReduction.MEAN else 1
        layer.g.add(stat.mul_((per_sample / self._loss_scale()) ** 2), count)

    # ------------------------------------------------------------- structure
    def factors(self) -> dict[str, KroneckerFactor]:
        """Every distinct factor, in a fixed order (shared A factors once)."""
        out: dict[str, KroneckerFactor] = {}
        for layer in self.layers.values():
            out.setdefault(layer.a.name, layer.a)
            out.setdefault(layer.g.name, layer.g)
        return out

    def _finalize_structure(self, fired: set[str] | None = None, same_input: dict[str, str] | None = None) -> None:
        """After the first window: drop layers whose hooks never fired, share inputs, assign work."""
        fired = self._agreed(self.capture.fired) if fired is None else fired
        if not self._discovered_info:
            from kaisa_ds.state import _layer_info

            self._discovered_info = _layer_info(self, list(self.layers))
        for name in [n for n in self.layers if n not in fired]:
            logger.warning("K-FAC: skipping %s: its forward hook never fired (the module is not called "
                           "directly, e.g. nn.MultiheadAttention.out_proj)", name)
            self.capture.detach(name)
            del self.layers[name]
        if not self.layers:
            raise RuntimeError("K-FAC: no layer's hooks fired; was the forward pass run in train mode with grad?")
        share_inputs(self.layers, self.capture.same_input if same_input is None else same_input)
        units: dict[str, list[str]] = {}
        for layer in self.layers.values():
            units.setdefault(layer.unit, [])
            for f in (layer.a, layer.g):
                if f.name not in units[layer.unit]:
                    units[layer.unit].append(f.name)
        facs = self.factors()
        work = [WorkUnit(u, tuple((f, facs[f].dim, facs[f].diagonal) for f in fs)) for u, fs in units.items()]
        self.assignment = assign_work(work, world=self.world, grad_workers=self.grad_workers)
        self._comm = KAISACommunicator(self.assignment, rank=self.rank)
        self._unit_factors = units
        self._unit_layers = {u: [n for n, ly in self.layers.items() if ly.unit == u] for u in units}
        if self._pending_decompositions is not None:
            self.decompositions = {f: d for f, d in self._pending_decompositions.items() if self._holds(f)}
            self._pending_decompositions = None

    def _agreed(self, fired: set[str]) -> set[str]:
        """Layers whose hooks fired on any rank, so every rank keeps the same layers (one-time collective)."""
        if self.world == 1:
            return fired
        device = next(iter(self.layers.values())).helper.weight.device
        flags = torch.tensor([float(n in fired) for n in self.layers], device=device)
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        return {n for n, f in zip(self.layers, flags.tolist()) if f > 0}

    def _holds(self, factor: str) -> bool:
        assert self.assignment is not None
        unit = next(u for u, fs in self._unit_factors.items() if factor in fs)
        return self.assignment.is_grad_worker(unit, self.rank)

    # ------------------------------------------------------------------ step
    def step(self) -> None:
        """Commit statistics, refresh decompositions, precondition and KL-clip the gradients."""
        run_step(self)

    def discard_window(self) -> None:
        """Drop the statistics gathered since the last step (e.g. when the optimizer skipped it)."""
        for f in self.factors().values():
            f.discard()

    # ------------------------------------------------------------- reporting
    @property
    def timings(self) -> dict[str, float]:
        """Seconds per K-FAC stage during the last :meth:`step` (factor capture: hook time since the step
        before); every stage is present, 0.0 when it did not run."""
        return {stage: self.timer.seconds.get(stage, 0.0) for stage in STAGES}

    def memory_usage(self) -> dict[str, int]:
        """Bytes held by factors (with any open window buffer) and by decompositions on this rank."""
        return {
            "factors": sum(f.nbytes() for f in self.factors().values()),
            "decompositions": sum(d.nbytes() for d in self.decompositions.values()),
        }

    def remove_hooks(self) -> None:
        self.capture.remove_all()

    def state_dict(self) -> dict[str, Any]:
        """Complete K-FAC state. A collective under torch.distributed: call it on every rank."""
        return export_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; ValueError when it belongs to a different model."""
        import_state(self, state)
