"""K-FAC layer records and their discovery in a model."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from kaisa_ds.config import KFACConfig
from kaisa_ds.enums import LossReduction
from kaisa_ds.factors.factor import KroneckerFactor
from kaisa_ds.layers.modules import ModuleHelper, helper_for

logger = logging.getLogger(__name__)


@dataclass
class KFACLayer:
    """One preconditioned module: its math helper and its A and G factors (A may be shared)."""

    name: str
    helper: ModuleHelper
    a: KroneckerFactor
    g: KroneckerFactor
    unit: str = ""

    @property
    def a_factor(self) -> torch.Tensor | None:
        """The A running average as a full symmetric matrix (a diagonal for embeddings is expanded)."""
        return self.a.dense()

    @property
    def g_factor(self) -> torch.Tensor | None:
        return self.g.dense()

    @property
    def module(self) -> nn.Module:
        return self.helper.module


def discover_layers(model: nn.Module, config: KFACConfig) -> dict[str, KFACLayer]:
    """Every supported, trainable, not-skipped module, in ``named_modules`` order.

    A weight shared by several modules (BERT's MLM decoder tied to the word embeddings) is preconditioned by none
    of them, with a warning: its gradient sums every sharer's contribution while a layer's factors describe one
    module's inputs and outputs (the embedding's A is zero for tokens absent from the batch, which the decoder
    still gives a gradient), so it is left to the optimizer alone, as KAISA's BERT recipe and kfac-pytorch leave
    embeddings.
    """
    candidates: list[tuple[str, ModuleHelper]] = []
    sharers: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        helper = helper_for(module)
        if helper is None or config.skips(name, type(module).__name__) or not helper.weight.requires_grad:
            continue
        candidates.append((name, helper))
        sharers.setdefault(id(helper.weight), []).append(name)
    for names in sharers.values():
        if len(names) > 1:
            logger.warning("K-FAC: skipping %s: they share one weight, whose gradient no single module's factors "
                           "describe (untie the weights to precondition them)", ", ".join(names))
    layers: dict[str, KFACLayer] = {}
    scale_g = config.loss_reduction is LossReduction.MEAN
    dtype = config.storage_dtype
    for name, helper in candidates:
        if len(sharers[id(helper.weight)]) > 1:
            continue
        a = KroneckerFactor(f"{name}.A", helper.a_dim, diagonal=helper.diagonal_a, storage_dtype=dtype,
                            scale_by_passes=False)
        g = KroneckerFactor(f"{name}.G", helper.g_dim, diagonal=False, storage_dtype=dtype,
                            scale_by_passes=scale_g)
        layers[name] = KFACLayer(name=name, helper=helper, a=a, g=g, unit=name)
    if not layers:
        raise ValueError(
            "K-FAC found no trainable nn.Linear, nn.Conv2d or nn.Embedding layer to precondition "
            "(check skip_layers)"
        )
    return layers


def share_inputs(layers: dict[str, KFACLayer], same_input: dict[str, str]) -> None:
    """Give layers that read the same input tensor as an earlier layer that layer's A factor and work unit.

    The earlier layer is the first reader of its input, so it never maps to another layer itself.
    """
    for name, first in same_input.items():
        layer, owner = layers.get(name), layers.get(first)
        if layer is None or owner is None:
            continue
        if type(layer.helper) is type(owner.helper) and layer.a.dim == owner.a.dim:
            layer.a = owner.a
            layer.unit = owner.unit
