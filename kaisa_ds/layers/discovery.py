"""K-FAC layer records and their discovery in a model."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from kaisa_ds.config import KFACConfig
from kaisa_ds.enums import LossReduction
from kaisa_ds.factors.factor import KroneckerFactor
from kaisa_ds.layers.coverage import Coverage, Kind, ModuleCoverage, Verdict, kind_of, own_trainable
from kaisa_ds.layers.modules import ModuleHelper, helper_for, why_unsupported

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
    """Every supported, trainable, not-skipped module, in ``named_modules`` order (see :func:`discover`)."""
    return discover(model, config)[0]


def discover(model: nn.Module, config: KFACConfig) -> tuple[dict[str, KFACLayer], Coverage]:
    """The K-FAC layers of ``model`` and the coverage they give (every module with trainable parameters, its verdict).

    A weight shared by several modules (BERT's MLM decoder tied to the word embeddings) is preconditioned by none
    of them, with a warning, also where ``skip_layers`` skips one of them: its gradient sums every sharer's
    contribution while a layer's factors describe one module's inputs and outputs (the embedding's A is zero for
    tokens absent from the batch, which the decoder still gives a gradient), so it is left to the optimizer alone,
    as KAISA's BERT recipe and kfac-pytorch leave embeddings. ValueError naming the module types found when no
    module can be preconditioned.
    """
    named = list(model.named_modules())
    params = own_trainable(named)
    candidates: list[tuple[str, ModuleHelper]] = []
    holders: dict[int, list[str]] = {}  # parameter -> every module holding it, skipped or unsupported ones too
    for name, module in named:
        for param in module.parameters(recurse=False):
            holders.setdefault(id(param), []).append(name)
    verdicts: dict[str, tuple[Verdict, str]] = {}
    for name, module in named:
        helper = helper_for(module, max_factor_dim=config.max_factor_dim, max_factor_ratio=config.max_factor_ratio)
        if helper is None:
            why = why_unsupported(module)
            verdicts[name] = ((Verdict.VECTORS, "") if kind_of(module) is Kind.VECTOR and why is None
                              else (Verdict.UNSUPPORTED, why or ""))
        elif config.skips(name, type(module).__name__):
            verdicts[name] = (Verdict.SKIPPED, "")
        elif not helper.weight.requires_grad:
            verdicts[name] = (Verdict.VECTORS, "its weight is frozen")
        else:
            candidates.append((name, helper))
            verdicts[name] = (Verdict.PRECONDITIONED, _factor_note(helper, config))
    tied = {id(h.weight): holders[id(h.weight)] for _, h in candidates if len(holders[id(h.weight)]) > 1}
    for names in tied.values():
        logger.warning("K-FAC: skipping %s: they share one weight, whose gradient no single module's factors "
                       "describe (untie the weights to precondition them)", ", ".join(names))
        verdicts.update({n: (Verdict.TIED, "shares its weight with " + ", ".join(o for o in names if o != n))
                         for n in names if verdicts[n][0] is Verdict.PRECONDITIONED})
    coverage = Coverage([ModuleCoverage(name, type(module).__name__, kind_of(module), params[name],
                                        *verdicts[name]) for name, module in named if params[name] or
                         verdicts[name][0] is Verdict.TIED])
    layers: dict[str, KFACLayer] = {}
    scale_g = config.loss_reduction is LossReduction.MEAN
    dtype = config.storage_dtype
    for name, helper in candidates:
        if id(helper.weight) in tied:
            continue
        a = KroneckerFactor(f"{name}.A", helper.a_dim, diagonal=helper.diagonal_a, storage_dtype=dtype,
                            scale_by_passes=False)
        g = KroneckerFactor(f"{name}.G", helper.g_dim, diagonal=helper.diagonal_g, storage_dtype=dtype,
                            scale_by_passes=scale_g)
        layers[name] = KFACLayer(name=name, helper=helper, a=a, g=g, unit=name)
    if not layers:
        found = coverage.by_type()
        kinds = ", ".join(f"{t} ({sum(v.values()):,} parameters: {', '.join(v)})"
                          for t, v in sorted(found.items(), key=lambda kv: -sum(kv[1].values()))[:8])
        raise ValueError(
            "K-FAC found no module it can precondition: it supports trainable nn.Linear, nn.Conv2d (groups=1), "
            f"nn.Embedding and transformers' Conv1D, not tied or skipped; the model has {kinds or 'no parameters'}"
            " (check skip_layers, or leave kfac off for this model)")
    return layers, coverage


def _factor_note(helper: ModuleHelper, config: KFACConfig) -> str:
    """Which dense sides keep only their diagonal, and which limit made them (an embedding's one-hot A goes
    unsaid: it is diagonal whatever the limits)."""
    sides = (("A", helper.a_dim, helper.g_dim, helper.diagonal_a and not helper.one_hot_input),
             ("G", helper.g_dim, helper.a_dim, helper.diagonal_g))
    limit, ratio = config.max_factor_dim, config.max_factor_ratio
    why = [f"{side} {dim:,} > max_factor_dim {limit:,}" if limit is not None and dim > limit
           else f"{side} {dim:,} > max_factor_ratio {ratio:g} x {other:,}"
           for side, dim, other, diagonal in sides if diagonal]
    return f"diagonal factor ({', '.join(why)})" if why else ""


def share_inputs(layers: dict[str, KFACLayer], same_input: dict[str, str]) -> None:
    """Give layers that read the same input tensor as an earlier layer that layer's A factor and work unit.

    The earlier layer is the first reader of its input, so it never maps to another layer itself.
    """
    for name, first in same_input.items():
        layer, owner = layers.get(name), layers.get(first)
        if layer is None or owner is None:
            continue
        if (type(layer.helper) is type(owner.helper) and layer.a.dim == owner.a.dim
                and layer.a.diagonal == owner.a.diagonal):
            layer.a = owner.a
            layer.unit = owner.unit
