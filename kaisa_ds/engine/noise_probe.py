"""The gradient noise scale of a DeepSpeed run trained without K-FAC (LAMB, Adam): the critical batch's scale, so a
user can learn whether a larger batch, and K-FAC with it, can pay before turning K-FAC on.

It measures what a K-FAC run's ``diagnostics_snapshot()["noise_scale"]`` does (``kaisa_ds.layers.noise_scale``),
over the same kind of parameters (the linear layers' weights and biases), from the per-pass gradients (a hook per
parameter, on measured steps only) and the step's reduced gradient, read between ``engine.backward`` and
``engine.step`` on the accumulation boundary, where every DeepSpeed mode holds it (``grad_access``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from kaisa_ds.engine.grad_access import EngineGradAccessor, engine_loss_scale
from kaisa_ds.layers.noise_scale import MEASURE_EVERY, NoiseScale
from kaisa_ds.precondition.apply import fp32_norms


class EngineNoiseProbe:
    """``B_simple`` of a DeepSpeed engine's linear layers, measured every ``every`` optimizer steps.

    Call :meth:`begin_step` before a step's first forward pass and :meth:`at_boundary` between ``engine.backward``
    and ``engine.step`` of its last pass (under ZeRO-1/2 the latter gathers each gradient: every rank must call it).
    """

    def __init__(self, engine: Any, *, samples_per_pass: int, world: int, every: int = MEASURE_EVERY,
                 smoothing: float = 0.9, start_step: int = 0) -> None:
        module = getattr(engine, "module", engine)
        self.params = [p for m in module.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False)
                       if p.requires_grad]
        if not self.params:
            raise ValueError("the noise-scale probe needs at least one trainable nn.Linear in the model")
        self.engine, self.samples_per_pass, self.world, self.every = engine, samples_per_pass, world, every
        self.noise = NoiseScale(self.params, smoothing=smoothing)
        self.grads = EngineGradAccessor(zero_stage=int(engine.zero_optimization_stage()))
        self.steps = start_step  # optimizer steps taken (a resumed run's)

    def begin_step(self) -> None:
        """Start measuring when this is a measured step (every ``every``-th, counting from 1)."""
        self.steps += 1
        if self.steps % self.every == 0:
            self.noise.start()

    def at_boundary(self) -> None:
        """Fold the step in: ``|G_B|²`` of the reduced gradient, unscaled, against the passes' norms."""
        if not self.noise.measuring:
            return
        scale = engine_loss_scale(self.engine)
        grads = [g.detach() for g in (self.grads.get(p) for p in self.params) if g is not None]
        step_sq = fp32_norms(grads).pow(2).sum() / scale**2
        passes = int(self.engine.gradient_accumulation_steps())
        self.noise.update(step_sq, samples_per_pass=self.samples_per_pass, passes=passes, world=self.world,
                          grad_scale=scale / passes)  # engine.backward divides the loss by the passes

    def snapshot(self) -> dict[str, float] | None:
        """``{"b_simple", "samples_per_pass", "samples_per_step"}`` in samples, as a K-FAC run reports it; None
        before a measurement (one host sync)."""
        b_simple = self.noise.b_simple()
        return None if b_simple is None else {"b_simple": b_simple, **self.noise.last}
