"""KFACPreconditioner: wires capture → factors → decomposition → communication → preconditioning.

It is the one owner of the step's state (counters, structure, decompositions, caches) and the only module that
assigns it: :mod:`kaisa_ds.step` reads it through :class:`~kaisa_ds.step.StepOwner` and hands back a
:class:`~kaisa_ds.step.StepOutcome`; :mod:`kaisa_ds.checkpoint` reads it to save and hands back a
:class:`~kaisa_ds.checkpoint.restore.Restored` to load. Every change of the structure or of a loaded state is built
aside and swapped in whole, so an error leaves the object usable.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from kaisa_ds.checkpoint.restore import restore_state
from kaisa_ds.checkpoint.state import export_state
from kaisa_ds.config import KFACConfig
from kaisa_ds.decomposition.registry import method_for
from kaisa_ds.decomposition.tensors import Decomposition, storage_bytes
from kaisa_ds.diagnostics import Diagnostics
from kaisa_ds.distributed.assignment import resolve_grad_workers
from kaisa_ds.distributed.collectives import cpu_ranks, on_any_rank, rank, world_size
from kaisa_ds.distributed.exit_grace import register_exit_grace
from kaisa_ds.distributed.reduction import WindowReducer
from kaisa_ds.factors.factor import KroneckerFactor
from kaisa_ds.feed import StatisticsFeed
from kaisa_ds.layers import coverage
from kaisa_ds.layers.discovery import KFACLayer, discover
from kaisa_ds.layers.modules import GradAccessor, GradWatermark, ParamGradAccessor
from kaisa_ds.layers.noise_scale import MEASURE_EVERY, NoiseScale
from kaisa_ds.precondition.grouped import GroupedPreconditioner
from kaisa_ds.step import STAGES, StepOutcome, run_step
from kaisa_ds.structure import LayerStructure, build_structure, factors_of, layer_info, layers_device
from kaisa_ds.timing import HostFlag, StageTimer, StepClock

logger = logging.getLogger(__name__)


class KFACPreconditioner:
    """Distributed K-FAC gradient preconditioner (KAISA), for any torch optimizer, in one process or under
    torch.distributed. Call :meth:`step` after the gradients are complete (reduced across ranks) and before
    ``optimizer.step()``: it replaces each layer's gradient by ``(A ⊗ G + γI)⁻¹ ∇``, KL-clipped.

    Args:
        model: the model whose supported modules are preconditioned (hooks are attached here; docs/models.md).
        config: every option at once (:class:`~kaisa_ds.config.KFACConfig`); None: the defaults.
        grad_accessor: where gradients are read and written (:class:`~kaisa_ds.layers.modules.GradAccessor`);
            None: ``param.grad``. Engines pass their own.
        options: :class:`~kaisa_ds.config.KFACConfig` fields as keywords; they override ``config``'s.

    Read, never assign: ``config``, ``steps`` (K-FAC steps taken), ``skipped_windows``, ``layers``, ``structure``,
    ``decompositions``, ``world``, ``rank``, ``grad_workers``, ``statistic_rows``, ``cost_interval``, ``coverage``;
    :meth:`load_state_dict`, :meth:`drop_window` and :meth:`use_decompositions` are the ways to change them.
    """

    def __init__(self, model: nn.Module, *, config: KFACConfig | None = None,
                 grad_accessor: GradAccessor | None = None, **options: Any) -> None:
        if config is not None and options:
            config = KFACConfig(**{**{k: getattr(config, k) for k in config.__dataclass_fields__
                                      if not k.startswith("_")}, **options})
        self.config = config if config is not None else KFACConfig(**options)
        self.model = model
        self.grads = grad_accessor or ParamGradAccessor()
        self.world, self.rank = world_size(), rank()
        if self.world > 1:
            register_exit_grace()  # gloo ranks could otherwise abort at exit, after the run is done
        self.grad_workers = resolve_grad_workers(self.config.grad_worker_fraction, self.world,  # type: ignore[arg-type]
                                                 cpu_ranks=cpu_ranks())
        self.steps = 0
        self._skipped = 0
        self._checks: list[tuple[int, HostFlag]] = []  # plain steps' finiteness, read a step late
        self.decompositions: dict[str, Decomposition] = {}
        self.needs_decomposition = False  # a loaded state lacked some decompositions
        self.statistic_rows: int | None = None  # rows per factor update over every rank ("auto" interval)
        self.cost_interval: int | None = None  # the "auto" interval's cost rule, once the decompositions were timed
        self.clock = StepClock()
        self.structure: LayerStructure | None = None
        self.watermark = GradWatermark()
        self.diagnostics = Diagnostics(eigenvalues=self.config.scaling)
        self.timer = StageTimer()
        self.comm_bytes: dict[str, int] = {}
        # factor reductions started in backward hooks get a process group of their own (a collective: every rank
        # builds the preconditioner), so they never interleave with the engine's gradient all-reduces
        self._reduce_group = (torch.distributed.new_group() if self.world > 1 and self.config.overlap_factor_reduction
                              else None)
        self._reducer: WindowReducer | None = None
        self.feed = StatisticsFeed(self)
        self.capture = self.feed.capture
        self.candidates, self.coverage = discover(model, self.config)
        self.grouped = GroupedPreconditioner(method_for(self.config.method_on(layers_device(self.candidates)),
                                                        eigenvalues=self.config.scaling))  # .method: its state too
        self.noise = NoiseScale(p for ly in self.candidates.values() for p in (ly.helper.weight, ly.helper.bias)
                                if p is not None)
        self._pass_at_step: int | None = None  # the capture's forward-pass count at the last step
        self.discovered_info = layer_info(self.candidates)
        self._attach_all()

    def _attach_all(self) -> None:
        self.capture.remove_all()
        self.capture.attach_model(self.model)
        for name, layer in self.candidates.items():
            self.capture.attach(name, layer.module, lookup=layer.helper.lookup_ids)

    @property
    def layers(self) -> dict[str, KFACLayer]:
        """The preconditioned layers: every candidate until the first step, then those whose hooks fired."""
        return self.structure.layers if self.structure is not None else self.candidates

    def loss_scale(self) -> float:
        """The loss scale in force (``config.loss_scale()``; 1 without one): gradients are divided by it."""
        return float(self.config.loss_scale()) if self.config.loss_scale is not None else 1.0

    def reducer_or_none(self) -> WindowReducer | None:
        """The window reducer once the structure is installed (the capture checks a window is still open)."""
        return self._reducer

    def take_capture_seconds(self) -> float:
        """Seconds spent in the hooks since the last call (reported as the step's factor_capture stage)."""
        return self.capture.take_seconds()

    def factors(self) -> dict[str, KroneckerFactor]:
        """Every distinct factor, in a fixed order (shared A factors once)."""
        return factors_of(self.layers)

    def ensure_structure(self) -> LayerStructure:
        """The structure, built on the first step from the layers whose hooks fired on any rank."""
        if self.structure is None:
            device = layers_device(self.candidates)  # every rank keeps the same layers
            fired = on_any_rank({n: n in self.capture.fired for n in self.candidates}, device=device)
            with_grad = set() if fired else {  # only to word the error; the same decision on every rank
                n for n, ly in self.candidates.items() if self.grads.get(ly.helper.weight) is not None}
            self._install(build_structure(self.candidates, fired=fired, same_input=self.capture.same_input,
                                          world=self.world, rank=self.rank, grad_workers=self.grad_workers,
                                          with_grad=with_grad))
        assert self.structure is not None
        return self.structure

    def _install(self, structure: LayerStructure) -> None:
        never = [n for n in self.candidates if n not in structure.layers]
        for name in never:
            self.capture.detach(name)
        self.coverage = coverage.settle(self.coverage, never=set(never), calls=self.capture.multi_call,
                                        log=self.rank == 0)
        self.diagnostics.coverage = self.coverage.summary()
        self.structure = structure
        self._reducer = WindowReducer({n: (ly.a, ly.g) for n, ly in structure.layers.items()}, config=self.config,
                                      world=self.world, group=self._reduce_group, calls=self.capture.calls)
        self.decompositions = {f: d for f, d in self.decompositions.items() if structure.holds(f, self.rank)}
        self.grouped.invalidate()

    def step(self) -> None:
        """Commit statistics, refresh decompositions, precondition and KL-clip the gradients. Always in the
        configured dtypes: a loop's ``torch.autocast`` around this call would turn the step's matmuls to half
        precision."""
        self._read_checks(wait=False)
        device = next(self.model.parameters()).device
        decomposes = self.steps % self.inv_update_steps() == 0 or self.needs_decomposition
        self.clock.mark(plain=not (decomposes or self.feed.capturing()), device=device)
        with torch.autocast(device.type, enabled=False):
            outcome = run_step(self)
        if outcome is not None:
            self._apply(outcome)
            self._measure_noise(outcome)

    def _measure_noise(self, outcome: StepOutcome) -> None:
        """Fold a measured step into the noise scale (its passes: the forward passes since the last step), and
        measure every ``MEASURE_EVERY``-th step."""
        now = self.capture.pass_id
        passes = now - self._pass_at_step if now is not None and self._pass_at_step is not None else None
        self._pass_at_step = now
        if outcome.grad_sq is not None and passes and self.capture.samples:
            self.noise.update(outcome.grad_sq, samples_per_pass=self.capture.samples, passes=passes,
                              world=self.world, grad_scale=self.loss_scale() / passes)
        if self.steps % MEASURE_EVERY == 0:
            self.noise.start()

    def inv_update_steps(self) -> int:
        """The decomposition interval in force (``"auto"``: from the statistic rows and the cost rule)."""
        return self.config.inv_update_steps_at(self.steps, rows=self.statistic_rows, cost=self.cost_interval)

    @property
    def skipped_windows(self) -> int:
        """Windows dropped and plain steps left alone because of non-finite values (reading it waits for the last
        plain step's check)."""
        self._read_checks(wait=True)
        return self._skipped

    def _read_checks(self, *, wait: bool) -> None:
        while self._checks and (wait or self._checks[0][1].ready()):
            step, flag = self._checks.pop(0)
            if not flag.value():
                self._skipped += 1
                logger.warning("K-FAC: non-finite gradients (or an FP32 overflow of their norms) at step %d; they "
                               "were left as they came (%d skipped so far)", step, self._skipped)

    def _apply(self, outcome: StepOutcome) -> None:
        if outcome.finite is not None:
            self._checks.append((self.steps, HostFlag(outcome.finite)))
        if outcome.statistic_rows is not None:
            self.feed.sampler.cap(rows_taken=outcome.statistic_rows, max_rows=self.config.max_statistic_rows)
        if outcome.statistic_rows is not None or outcome.cost_interval is not None:  # inv_update_steps "auto"
            self.statistic_rows = outcome.statistic_rows or self.statistic_rows
            self.cost_interval = outcome.cost_interval or self.cost_interval
            if self.rank == 0:
                logger.info("K-FAC: decompositions every %d steps (inv_update_steps 'auto': %s statistic rows per "
                            "factor update; decomposition cost timed: %s)", self.inv_update_steps(),
                            self.statistic_rows, "not yet" if outcome.cost_interval is None else
                            f"{self.clock.round_seconds(rounds=1) or 0.0:.3g} s a round against "
                            f"{self.clock.plain_seconds() or 0.0:.3g} s a plain step; pin it for exact reruns")
        for kind, sent in outcome.comm_bytes.items():
            self.comm_bytes[kind] = self.comm_bytes.get(kind, 0) + sent
        if outcome.dropped:
            self.drop_window()
            logger.warning("K-FAC: non-finite statistics or gradients (or an FP32 overflow of their norms) at step %d; "
                           "window dropped on every rank and gradients left alone (%d skipped so far)",
                           self.steps - 1, self.skipped_windows)
            return
        if outcome.decompositions is not None:  # the step rebuilt the grouped cache for them already
            self.decompositions, self.needs_decomposition = outcome.decompositions, False
        self.steps += 1

    def drop_window(self) -> None:
        """Count this window as skipped: drop its statistics and advance the step counter, leaving the gradients
        alone (a step with non-finite values, or one the optimizer skips)."""
        self._skipped += 1
        self.discard_window()
        self.steps += 1

    def use_decompositions(self, decompositions: dict[str, Decomposition], *, recompute: bool) -> None:
        """Precondition with the given decompositions from now on.

        Args:
            decompositions: factor name -> decomposition, for the factors this rank holds.
            recompute: decompose every factor again at the next step, whatever ``inv_update_steps`` says (a
                collective decision: pass the same value on every rank).
        """
        self.decompositions = dict(decompositions)
        self.grouped.invalidate()
        self.needs_decomposition = recompute

    def discard_window(self) -> None:
        """Drop the statistics gathered since the last step (e.g. when the optimizer skipped it)."""
        for f in self.factors().values():
            f.discard()
        if self._reducer is not None:
            self._reducer.reset()

    def window_reducer(self) -> WindowReducer:
        """The reduction of the factor windows of the installed structure."""
        assert self._reducer is not None, "the structure is built before any window is reduced"
        return self._reducer

    @property
    def timings(self) -> dict[str, float]:
        """Seconds per stage of the last :meth:`step` (capture: hook time since the step before; 0.0: not run)."""
        return {stage: self.timer.seconds.get(stage, 0.0) for stage in STAGES}

    def diagnostics_snapshot(self) -> dict[str, Any]:
        """The figures of :meth:`~kaisa_ds.diagnostics.Diagnostics.snapshot` (one host sync), the interval in force."""
        return {**self.diagnostics.snapshot(self.steps, skipped_windows=self.skipped_windows, noise=self.noise),
                "inv_update_steps": self.inv_update_steps(), "cost_interval": self.cost_interval}

    def memory_usage(self) -> dict[str, int]:
        """Bytes this rank holds in factors (any open window too), decompositions, denominators and method state."""
        return {"factors": sum(f.nbytes() for f in self.factors().values()),
                "decompositions": storage_bytes(self.decompositions.values()), "denominators": self.grouped.nbytes()}

    def remove_hooks(self) -> None:
        """Detach every capture hook from the model (the preconditioner then learns nothing new)."""
        self.capture.remove_all()

    def state_dict(self) -> dict[str, Any]:
        """Complete K-FAC state. A collective under torch.distributed: call it on every rank."""
        return export_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (same model, any world size). ValueError naming the problem when
        it belongs to another model or is corrupt (nothing is changed then).

        Args:
            state: a state from :meth:`state_dict` of a preconditioner of the same model (saved at any world size).
        """
        restored = restore_state(self, state)  # raises before anything here changes
        if restored.candidates is not None:
            self.candidates = restored.candidates
        self.structure, self._reducer, self.decompositions = None, None, {}
        self._attach_all()
        if restored.structure is not None:
            self.decompositions = restored.decompositions
            self._install(restored.structure)
            self.needs_decomposition = restored.needs_decomposition
        self.grouped.method.load_state(restored.scaling_state)
        self.steps, self._skipped, self._checks = restored.steps, restored.skipped_windows, []
        self.statistic_rows, self.cost_interval = restored.statistic_rows, restored.cost_interval
        if self.statistic_rows is not None:
            self.feed.sampler.cap(rows_taken=self.statistic_rows, max_rows=self.config.max_statistic_rows)
        self.watermark = GradWatermark()
