"""What the capture hooks feed the factors: each layer's input and output-gradient statistics, sampled as configured,
counted per pass, and handed to the window's reduction when its last pass completes.

:class:`StatisticsFeed` owns the hooks (:class:`~kaisa_ds.layers.hooks.HookCapture`) and the samplers; it reads the
preconditioner's layers, step counter, loss scale and window reducer through :class:`FeedOwner` and changes only the
factors' open windows.
"""

from __future__ import annotations

from typing import Protocol

import torch

from kaisa_ds.config import KFACConfig
from kaisa_ds.distributed.reduction import WindowReducer
from kaisa_ds.enums import LossReduction
from kaisa_ds.factors.sampling import PassSampler, RowSampler
from kaisa_ds.layers.discovery import KFACLayer
from kaisa_ds.layers.hooks import HookCapture


class FeedOwner(Protocol):
    config: KFACConfig
    steps: int

    @property
    def layers(self) -> dict[str, KFACLayer]: ...

    def loss_scale(self) -> float: ...

    def reducer_or_none(self) -> WindowReducer | None: ...


class StatisticsFeed:
    """The hooks' callbacks: A and G statistics of every layer whose window is open (a factor-update step)."""

    def __init__(self, owner: FeedOwner) -> None:
        self.owner = owner
        config = owner.config
        self.sampler = RowSampler(fraction=config.factor_sample_fraction)
        self.pass_sampler = PassSampler(fraction=config.factor_pass_fraction, passes=config.accumulation_steps)
        self._cache: tuple[int, bool] = (-1, False)
        self.capture = HookCapture(enabled=self.capturing, on_input=self.on_input, on_output_grad=self.on_grad)

    def capturing(self) -> bool:
        """Whether the current window updates factors (cached per step: hooks ask once per layer)."""
        steps = self.owner.steps
        if self._cache[0] != steps:
            self._cache = (steps, steps % self.owner.config.value("factor_update_steps", steps) == 0)
        return self._cache[1]

    def on_input(self, name: str, inp: torch.Tensor, pass_id: int | None) -> None:
        layer = self.owner.layers.get(name)
        if layer is None or (layer.unit != name and layer.a.already_counted(inp)):
            # a later reader of a shared A factor whose first reader counted this very tensor in this pass; the
            # first reader always counts (the same tensor object fed again on a later pass is a new pass)
            return
        reducer, steps = self.owner.reducer_or_none(), self.owner.steps
        if reducer is not None:
            reducer.check_open(layer.a)
        index = layer.a.pass_index(pass_id)
        if self.pass_sampler.keeps(step=steps, pass_index=index):
            rows = self.sampler.selector(step=steps, pass_index=index)
            layer.a.add(*layer.helper.a_statistic(inp, rows), pass_id=pass_id)
        else:
            layer.a.skip_pass(pass_id=pass_id)
        layer.a.mark_counted(inp)

    def on_grad(self, name: str, grad: torch.Tensor, pass_id: int | None) -> None:
        layer = self.owner.layers.get(name)
        if layer is None:
            return
        reducer, steps = self.owner.reducer_or_none(), self.owner.steps
        if reducer is not None:
            reducer.check_open(layer.g)
        index = layer.g.pass_index(pass_id)
        if self.pass_sampler.keeps(step=steps, pass_index=index):
            stat, count = layer.helper.g_statistic(grad, self.sampler.selector(step=steps, pass_index=index))
            per_sample = grad.shape[0] if self.owner.config.loss_reduction is LossReduction.MEAN else 1
            layer.g.add(stat.mul_((per_sample / self.owner.loss_scale()) ** 2), count, pass_id=pass_id)
        else:
            layer.g.skip_pass(pass_id=pass_id)
        if reducer is not None:  # on the window's last pass this may start a bucket's all-reduce
            reducer.grad_complete(name, layer.g)
