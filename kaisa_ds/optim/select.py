"""Builds LAMB from a DeepSpeed config with the best implementation of one semantics this machine has.

``auto``: NVIDIA Apex ``FusedLAMB`` (the reference semantics, fused CUDA kernels), else ``kaisa_ds.optim.lamb.Lamb``
(pure PyTorch, Apex semantics, any device). DeepSpeed's ``FusedLamb`` (CUDA, JIT-built) is a different LAMB
(:class:`kaisa_ds.enums.LambImplementation` says how), so it is built only when asked for by name.
The PyPI package called ``apex`` is an unrelated web toolkit: Apex counts only when NVIDIA Apex's CUDA
extension ``amp_C`` exists, checked with ``find_spec`` before anything named ``apex`` is imported.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from kaisa_ds.enums import LambImplementation, parse_enum
from kaisa_ds.optim.lamb import APEX_EPS, APEX_MAX_GRAD_NORM, Lamb, global_grad_norm
from kaisa_ds.optim.param_groups import weight_decay_groups

logger = logging.getLogger(__name__)

# DeepSpeed's "Lamb" optimizer params (deepspeed/ops/lamb/fused_lamb.py); missing ones take Apex's defaults.
DS_LAMB_KEYS = ("lr", "betas", "eps", "weight_decay", "bias_correction", "max_grad_norm", "max_coeff", "min_coeff",
                "implementation", "use_nvlamb")
ARCH_ENV = "TORCH_CUDA_ARCH_LIST"


def is_lamb_config(section: Mapping[str, Any] | None) -> bool:
    """True when a DeepSpeed ``optimizer`` section asks for LAMB (``type`` compared case-insensitively)."""
    return isinstance(section, Mapping) and str(section.get("type", "")).lower() == "lamb"


def _apex_fused_lamb(params: list[Any]) -> tuple[type | None, str]:
    """NVIDIA Apex FusedLAMB, or None and why not."""
    if importlib.util.find_spec("amp_C") is None:
        return None, "NVIDIA Apex is not installed (no amp_C CUDA extension)"
    try:
        from apex.optimizers import FusedLAMB  # type: ignore[import-not-found]
    except Exception as exc:  # a broken or foreign 'apex' must not stop training
        return None, f"apex.optimizers.FusedLAMB does not import ({exc!r})"
    if not torch.cuda.is_available():
        return None, "NVIDIA Apex FusedLAMB needs CUDA"
    first = _first_tensor(params)
    if first is None or not first.is_cuda:  # FusedLAMB allocates its overflow flag on the first param's device
        return None, "NVIDIA Apex FusedLAMB needs the parameters on the GPU (move the model there first)"
    return FusedLAMB, ""


def _deepspeed_fused_lamb() -> tuple[type | None, str]:
    """DeepSpeed FusedLamb wrapped to receive the global grad norm, or None and why not."""
    if not torch.cuda.is_available():
        return None, "DeepSpeed's FusedLamb needs CUDA"
    try:
        from deepspeed.ops.lamb import fused_lamb

        if not fused_lamb.FusedLambBuilder().is_compatible(verbose=False):
            return None, "DeepSpeed's FusedLambBuilder is not compatible with this install (ds_report tells why)"
    except Exception as exc:
        return None, f"DeepSpeed's FusedLamb unavailable ({exc!r})"

    class GlobalNormFusedLamb(fused_lamb.FusedLamb):  # type: ignore[misc,name-defined]
        """DeepSpeed FusedLamb given the global gradient norm its clipping needs.

        DeepSpeed passes ``grad_norms`` only from its legacy fp16 path; a client optimizer is stepped
        without it, and FusedLamb then fails on ``None / scale`` whenever ``max_grad_norm > 0``.
        """

        def step(self, closure: Any = None, grads: Any = None, output_params: Any = None, scale: float = 1.0,
                 grad_norms: Any = None) -> Any:
            if grads is None and grad_norms is None and any(g["max_grad_norm"] > 0 for g in self.param_groups):
                live = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
                # The grads carry ``scale`` already, as FusedLamb expects of grad_norms. One host sync per step;
                # FusedLamb's own ``if clip > 1`` would sync once per parameter on a tensor.
                norm = float(global_grad_norm(live)) if live else 0.0
                grad_norms = [[norm] * len(g["params"]) for g in self.param_groups]
            return super().step(closure, grads, output_params, scale, grad_norms)

    return GlobalNormFusedLamb, ""


def parseable_arch_list(value: str) -> str:
    """``TORCH_CUDA_ARCH_LIST`` as DeepSpeed 0.19's JIT builder can parse it: PyTorch's arch-specific suffix
    (``9.0a``, which CUDA images set for Hopper) dropped, ``+PTX`` kept, ``;``-separated."""
    entries = [e for e in re.split(r"[;\s]+", value.strip()) if e]
    return ";".join(re.sub(r"^(\d+\.\d+)[a-z]+", r"\1", e) for e in entries)


@contextlib.contextmanager
def _deepspeed_buildable_arch_list() -> Iterator[None]:
    """Set a parseable ``TORCH_CUDA_ARCH_LIST`` for the JIT build (an H100 image's ``9.0a`` fails it with
    ``int('0a')``); the user's value is restored afterwards."""
    value = os.environ.get(ARCH_ENV)
    if value is None or parseable_arch_list(value) == value:
        yield
        return
    os.environ[ARCH_ENV] = parseable_arch_list(value)
    try:
        yield
    finally:
        os.environ[ARCH_ENV] = value


def _build_deepspeed_fused_lamb(params: list[Any], *, max_coeff: float, min_coeff: float,
                                **common: Any) -> torch.optim.Optimizer:
    """DeepSpeed's FusedLamb, asked for by name: built, or a RuntimeError that says why not."""
    ds_cls, why = _deepspeed_fused_lamb()
    if ds_cls is None:
        raise RuntimeError(f"LAMB implementation='deepspeed' was asked for, but {why}; use 'auto' for Apex's "
                           "FusedLAMB or kaisa_ds's LAMB")
    try:
        with _deepspeed_buildable_arch_list():
            opt = ds_cls(params, max_coeff=max_coeff, min_coeff=min_coeff, **common)
    except Exception as exc:  # the op is JIT-built here: no nvcc, a CUDA mismatch, ...
        raise RuntimeError(f"LAMB implementation='deepspeed': DeepSpeed's FusedLamb failed to build ({exc!r}); "
                           "ds_report shows what its op builder lacks; use 'auto' for kaisa_ds's LAMB") from exc
    logger.info("LAMB: using DeepSpeed FusedLamb. It differs from Apex: its step is scaled by sqrt(1-b2^t)/(1-b1^t) "
                "after the trust ratio, the ratio is clamped to [%g, %g] and applied to every parameter, eps is "
                "added to sqrt(v) before bias correction", min_coeff, max_coeff)
    return opt  # type: ignore[no-any-return]


def _first_tensor(params: list[Any]) -> torch.Tensor | None:
    for item in params:
        if isinstance(item, torch.Tensor):
            return item
        if isinstance(item, Mapping) and item.get("params"):
            return next(iter(item["params"]))
    return None


def build_lamb(
    params_or_groups: Iterable[Any], *, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = APEX_EPS,
    weight_decay: float = 0.01, max_grad_norm: float = APEX_MAX_GRAD_NORM, bias_correction: bool = True,
    max_coeff: float = 10.0, min_coeff: float = 0.01, implementation: LambImplementation | str = "auto",
    use_nvlamb: bool = False,
) -> tuple[torch.optim.Optimizer, str]:
    """The LAMB ``implementation`` names (``auto``: the fastest of Apex semantics here) and its name; logs the
    choice and why faster ones were skipped.

    ``max_coeff``/``min_coeff`` clamp the trust ratio in DeepSpeed's FusedLamb only; Apex's and
    kaisa_ds's LAMB do not clamp it. ``use_nvlamb``: Apex's NVLAMB, the trust ratio on every parameter, biases and
    LayerNorm included (without it, only on those with weight decay); DeepSpeed's FusedLamb always does that.
    """
    impl = parse_enum(LambImplementation, implementation, name="optimizer.params.implementation")
    params = list(params_or_groups)
    common = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                  bias_correction=bias_correction)
    if impl is LambImplementation.DEEPSPEED:
        return _build_deepspeed_fused_lamb(params, max_coeff=max_coeff, min_coeff=min_coeff, **common), \
            "deepspeed.FusedLamb"
    common["use_nvlamb"] = use_nvlamb
    apex_why = "not asked for (implementation='torch')"
    if impl is not LambImplementation.TORCH:
        apex_cls, apex_why = _apex_fused_lamb(params)
        if apex_cls is not None:
            logger.info("LAMB: using NVIDIA Apex FusedLAMB")
            return apex_cls(params, **common), "apex.FusedLAMB"
        if impl is LambImplementation.APEX:
            raise RuntimeError(f"LAMB implementation='apex' was asked for, but {apex_why}; use 'auto' for "
                               "kaisa_ds's LAMB (the same semantics)")
    hint = (" DeepSpeed's FusedLamb is faster on a GPU but a different LAMB; set \"implementation\": \"deepspeed\" "
            "in optimizer.params to use it" if torch.cuda.is_available() else "")
    logger.info("LAMB: using kaisa_ds.optim.lamb.Lamb (pure PyTorch, Apex FusedLAMB semantics): %s.%s",
                apex_why, hint)
    return Lamb(params, **common), "kaisa_ds.Lamb"  # type: ignore[arg-type]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# key -> (valid?, allowed values in words)
_RANGES: dict[str, tuple[Any, str]] = {
    "lr": (lambda v: v >= 0, "a number >= 0"),
    "eps": (lambda v: v >= 0, "a number >= 0"),
    "weight_decay": (lambda v: v >= 0, "a number >= 0"),
    "max_grad_norm": (lambda v: v >= 0, "a number >= 0 (0 turns the global gradient-norm clipping off)"),
    "max_coeff": (lambda v: v > 0, "a number > 0"),
    "min_coeff": (lambda v: v >= 0, "a number >= 0"),
}


def lamb_kwargs_from_ds_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``build_lamb`` keyword arguments from DeepSpeed's Lamb ``params``; unknown keys or bad values raise."""
    unknown = sorted(set(params) - set(DS_LAMB_KEYS))
    if unknown:
        raise ValueError(f"optimizer.params: unknown Lamb key(s) {unknown}; allowed keys: {list(DS_LAMB_KEYS)}")
    kwargs: dict[str, Any] = {}
    for key, (ok, allowed) in _RANGES.items():
        if key in params:
            value = params[key]
            if not _is_number(value) or not ok(value):
                raise ValueError(f"optimizer.params.{key}={value!r} is not valid; allowed: {allowed}")
            kwargs[key] = float(value)
    if "betas" in params:
        betas = params["betas"]
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2
                and all(_is_number(b) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"optimizer.params.betas={betas!r} is not valid; allowed: two numbers in [0, 1), "
                             "e.g. [0.9, 0.999]")
        kwargs["betas"] = (float(betas[0]), float(betas[1]))
    for flag in ("bias_correction", "use_nvlamb"):
        if flag in params:
            if not isinstance(params[flag], bool):
                raise ValueError(f"optimizer.params.{flag}={params[flag]!r} is not valid; allowed: true or false")
            kwargs[flag] = params[flag]
    if "implementation" in params:
        kwargs["implementation"] = parse_enum(LambImplementation, params["implementation"],
                                              name="optimizer.params.implementation")
    if kwargs.get("min_coeff", 0.01) > kwargs.get("max_coeff", 10.0):
        raise ValueError("optimizer.params: min_coeff must not exceed max_coeff")
    return kwargs


def lamb_from_ds_config(optimizer_section: Mapping[str, Any], model: nn.Module) -> tuple[torch.optim.Optimizer, str]:
    """LAMB for a DeepSpeed ``"optimizer": {"type": "Lamb", "params": {...}}`` section, on BERT's groups.

    Keys missing from ``params`` take Apex FusedLAMB's defaults (lr 1e-3, eps 1e-6, weight_decay 0.01,
    max_grad_norm 1.0), not DeepSpeed FusedLamb's (eps 1e-8, no decay, no clipping).
    """
    if not is_lamb_config(optimizer_section):
        raise ValueError(f"optimizer.type must be 'Lamb' here, got {optimizer_section.get('type')!r}")
    params = optimizer_section.get("params", {})
    if not isinstance(params, Mapping):
        raise ValueError(f"optimizer.params must be a JSON object, got {params!r}")
    kwargs = {"lr": 1e-3, **lamb_kwargs_from_ds_params(params)}
    groups = weight_decay_groups(model, weight_decay=kwargs.get("weight_decay", 0.01))
    return build_lamb(groups, **kwargs)
