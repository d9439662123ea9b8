"""Picks the best LAMB available: NVIDIA Apex FusedLAMB, DeepSpeed's fused Lamb on CUDA, else kaisa_ds's.

The PyPI package called ``apex`` is an unrelated web toolkit, so Apex counts only when its CUDA
extension ``amp_C`` and ``apex.optimizers.FusedLAMB`` both import.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from kaisa_ds.optim.lamb import Lamb

logger = logging.getLogger(__name__)

# DeepSpeed's Lamb params (ops/lamb/fused_lamb.py) and what they mean here.
DS_LAMB_KEYS = {"lr", "betas", "eps", "weight_decay", "bias_correction", "max_grad_norm", "max_coeff",
                "min_coeff", "eps_inside_sqrt", "amsgrad"}
NO_DECAY_NAMES = ("bias", "LayerNorm", "layer_norm", "layernorm")


def is_lamb_config(section: Mapping[str, Any] | None) -> bool:
    """True when a DeepSpeed ``optimizer`` section asks for LAMB."""
    return bool(section) and str(section.get("type", "")).lower() in ("lamb", "fusedlamb")  # type: ignore[union-attr]


def lamb_param_groups(model: nn.Module, *, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: weight decay for weights, none for biases and LayerNorm parameters (as BERT does)."""
    no_decay_ids = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in no_decay_ids or any(k in name for k in NO_DECAY_NAMES):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _apex_fused_lamb() -> tuple[type | None, str]:
    try:
        import amp_C  # type: ignore[import-not-found]  # noqa: F401  (NVIDIA Apex's CUDA extension)
        from apex.optimizers import FusedLAMB  # type: ignore[import-not-found]
    except ImportError as exc:
        return None, f"NVIDIA Apex not importable ({exc})"
    return FusedLAMB, ""


def _deepspeed_fused_lamb() -> tuple[type | None, str]:
    if not torch.cuda.is_available():
        return None, "DeepSpeed's FusedLamb needs CUDA"
    try:
        from deepspeed.ops.lamb import FusedLamb
        from deepspeed.ops.op_builder import FusedLambBuilder

        if not FusedLambBuilder().is_compatible():
            return None, "DeepSpeed's FusedLamb op is not compatible with this install"
    except Exception as exc:  # any build/import problem means: not available
        return None, f"DeepSpeed's FusedLamb unavailable ({exc})"
    return FusedLamb, ""


def build_lamb(params: Iterable[Any], *, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
               weight_decay: float = 0.01, max_grad_norm: float = 1.0,
               bias_correction: bool = True) -> tuple[torch.optim.Optimizer, str]:
    """The best LAMB implementation available, and its name (logged with the reasons for skipping others)."""
    params = list(params)
    apex_cls, apex_why = _apex_fused_lamb()
    if apex_cls is not None and torch.cuda.is_available():
        logger.info("LAMB: using NVIDIA Apex FusedLAMB")
        return apex_cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, bias_correction=bias_correction), "apex.FusedLAMB"
    ds_cls, ds_why = _deepspeed_fused_lamb()
    if ds_cls is not None:
        logger.info("LAMB: using DeepSpeed FusedLamb (%s)", apex_why)
        return ds_cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                      bias_correction=bias_correction, max_grad_norm=max_grad_norm), "deepspeed.FusedLamb"
    logger.info("LAMB: using kaisa_ds.optim.Lamb (pure PyTorch; %s; %s)", apex_why or "Apex needs CUDA", ds_why)
    return Lamb(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                bias_correction=bias_correction), "kaisa_ds.Lamb"


def lamb_from_ds_config(section: Mapping[str, Any], model: nn.Module) -> tuple[torch.optim.Optimizer, str]:
    """Build LAMB from a DeepSpeed ``optimizer`` section on BERT's decay / no-decay parameter groups."""
    params = dict(section.get("params", {}))
    unknown = sorted(set(params) - DS_LAMB_KEYS)
    if unknown:
        raise ValueError(f"optimizer.params: unknown Lamb key(s) {unknown}; allowed keys: {sorted(DS_LAMB_KEYS)}")
    for ignored in ("max_coeff", "min_coeff", "eps_inside_sqrt", "amsgrad"):
        if ignored in params:
            logger.info("LAMB: optimizer.params.%s is specific to DeepSpeed's FusedLamb and is ignored", ignored)
            params.pop(ignored)
    weight_decay = float(params.pop("weight_decay", 0.01))
    kwargs: dict[str, Any] = {"lr": float(params.pop("lr", 1e-3)), "weight_decay": weight_decay}
    if "betas" in params:
        kwargs["betas"] = tuple(float(b) for b in params.pop("betas"))
    for key in ("eps", "max_grad_norm"):
        if key in params:
            kwargs[key] = float(params.pop(key))
    if "bias_correction" in params:
        kwargs["bias_correction"] = bool(params.pop("bias_correction"))
    return build_lamb(lamb_param_groups(model, weight_decay=weight_decay), **kwargs)
