"""Reading a DeepSpeed config (dict, path or ``args.deepspeed_config``) and its ``kfac`` section, validated once."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kaisa_ds.config import KFACConfig
from kaisa_ds.engine.rate_scale import DEFAULT_LR_SCALE, check_lr_scale
from kaisa_ds.enums import Grafting
from kaisa_ds.optim.poly_warmup import PolyWarmUpScheduler
from kaisa_ds.optim.select import is_lamb_config

logger = logging.getLogger(__name__)

ENGINE_KEYS = {"enabled", "auto_step", "lr_scale"}  # kfac keys the engine integration reads
SET_BY_ENGINE = {  # KFACConfig fields the engine supplies; a config value would be silently overridden
    "lr": "follows the engine's current learning rate (optimizer and scheduler sections)",
    "loss_scale": "follows the engine's loss scale (fp16 section)",
}


@dataclass
class KFACSection:
    """The parsed ``kfac`` section: whether K-FAC is on, whether ``engine.step`` runs it, the factor on the
    optimizer's rate while it does (:mod:`kaisa_ds.engine.rate_scale`), and its options."""

    enabled: bool
    auto_step: bool
    config: KFACConfig | None
    lr_scale: float = DEFAULT_LR_SCALE


def load_config(config: dict[str, Any] | str | Path | None, args: Any = None) -> dict[str, Any]:
    """The DeepSpeed config as a dict (a deep copy: the caller's dict is never modified)."""
    if config is None and args is not None and getattr(args, "deepspeed_config", None):
        config = args.deepspeed_config
    if config is None:
        raise ValueError("no DeepSpeed config: pass config= (a dict or a JSON path) or --deepspeed_config FILE")
    if isinstance(config, dict):
        return copy.deepcopy(config)
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"DeepSpeed config {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"DeepSpeed config {path} is not a UTF-8 text file ({exc.reason} at byte {exc.start}); "
                         "give the JSON config file") from exc
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError:
        import hjson  # DeepSpeed's own config parser (allows comments)

        try:
            loaded = hjson.loads(text)
        except hjson.HjsonDecodeError as exc:
            raise ValueError(f"DeepSpeed config {path} is not valid JSON/HJSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ValueError(f"DeepSpeed config {path} must hold a JSON object")
    return dict(loaded)


def parse_kfac_section(config: dict[str, Any]) -> KFACSection:
    """Validate the ``kfac`` section; absent or ``enabled: false`` means K-FAC is off.

    Every error names ``kfac.<key>`` and the allowed values, and fires at start-up (also when disabled,
    so typos surface before a long run is launched with K-FAC switched on). ``kfac.damping`` is absolute (what
    every shipped config means by it); without it ``kfac.relative_damping`` (default 10 under the default grafting,
    100 with ``"grafting": "none"``: :mod:`kaisa_ds.config`) scales with each layer's curvature; ``kfac.damping_mode``
    ("relative" / "absolute") names the mode explicitly; both values given is an error.
    """
    section = config.get("kfac")
    if section is None:
        return KFACSection(enabled=False, auto_step=True, config=None)
    if not isinstance(section, dict):
        raise ValueError(f"kfac must be a JSON object, got {section!r}")
    enabled, auto_step = section.get("enabled", True), section.get("auto_step", True)
    for key, value in (("enabled", enabled), ("auto_step", auto_step)):
        if not isinstance(value, bool):
            raise ValueError(f"kfac.{key}={value!r} is not valid; allowed: true or false")
    for key, why in SET_BY_ENGINE.items():
        if key in section:
            raise ValueError(f"kfac.{key} cannot be set in the config: it {why}; remove the key")
    options = {k: v for k, v in section.items() if k not in ENGINE_KEYS}
    allowed = sorted(ENGINE_KEYS | {f.name for f in dataclasses.fields(KFACConfig) if f.init} - set(SET_BY_ENGINE))
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"kfac: unknown key(s) {', '.join('kfac.' + k for k in unknown)}; allowed keys: {allowed}")
    lr_scale = check_lr_scale(section.get("lr_scale", DEFAULT_LR_SCALE))
    kfac_config = KFACConfig.from_dict(options)
    return KFACSection(enabled=enabled, auto_step=auto_step, config=kfac_config if enabled else None,
                       lr_scale=lr_scale)


def zero_stage(config: dict[str, Any]) -> int:
    section = config.get("zero_optimization", {})
    if not isinstance(section, dict):
        raise ValueError(f"zero_optimization must be a JSON object, got {section!r}")
    return int(section.get("stage", 0))


def lamb_advice(config: dict[str, Any], section: KFACSection) -> str | None:
    """Why K-FAC over this config's LAMB may train worse than LAMB alone, or None.

    K-FAC hands LAMB preconditioned gradients of its own sizes; LAMB's global-norm pre-normalisation
    (``max_grad_norm`` > 0) divides them all by one number, which puts the word embeddings' and output bias's Adam
    steps in epsilon's regime. Without it K-FAC with ``grafting: "none"`` ended below LAMB in no seed
    (benchmarks/README.md, "Size or direction"). Grafted onto the gradient (the default), K-FAC hands LAMB the raw
    gradients' sizes; the ``kfac-size`` ablation hands it K-FAC's, as ``none`` does."""
    if not section.enabled or not is_lamb_config(config.get("optimizer")):
        return None
    if section.config is None or section.config.grafting is Grafting.GRADIENT:  # LAMB's own sizes
        return None
    params = config["optimizer"].get("params")
    # only an explicit 0: absent is Apex's 1.0, and a malformed section is left to the LAMB builder, which names it
    if not isinstance(params, dict) or params.get("max_grad_norm") != 0:
        return None
    return (f"kfac with grafting '{Grafting(section.config.grafting).value}' over optimizer Lamb with "
            "optimizer.params.max_grad_norm 0: LAMB's global-norm pre-normalisation is off, and part of K-FAC's gain "
            "under LAMB comes through it (on BERT-tiny, K-FAC with grafting 'none' over such a LAMB ended 0.27-0.37 "
            "nats above that LAMB's held-out MLM loss in both seeds; kaisa_ds benchmarks/README.md, 'Size or "
            "direction'). Set optimizer.params.max_grad_norm to 1.0 (Apex's default) or remove the key")


def check_supported(config: dict[str, Any], section: KFACSection, *, lamb: bool) -> None:
    """Refuse combinations that cannot work, with the fix in the message; warn about those measured to train worse
    (:func:`lamb_advice`)."""
    advice = lamb_advice(config, section)
    if advice:
        logger.warning("kaisa_ds: %s", advice)
    stage = zero_stage(config)
    if section.enabled and stage == 3:
        raise ValueError("kfac: ZeRO stage 3 is not supported (partitioned parameters break the factor hooks); "
                         "use zero_optimization.stage 0, 1 or 2")
    if section.enabled and config.get("managed_gradient_accumulation", True) is not True:
        raise ValueError("kfac: managed_gradient_accumulation=false is not supported (gradients are reduced "
                         "inside engine.step, after K-FAC would have read them); remove the key or set it to true")
    if lamb and stage in (1, 2):
        raise ValueError("optimizer Lamb with zero_optimization.stage "
                         f"{stage}: LAMB's per-tensor trust ratio would be computed over ZeRO's flat partitions "
                         "instead of per parameter; use stage 0 with Lamb")


def poly_warmup_from_config(section: Any) -> Callable[[Any], PolyWarmUpScheduler]:
    """``"lr_schedule": {"type": "PolyWarmUp", "warmup_proportion", "total_steps", "degree"}`` (NVIDIA's BERT
    schedule, which DeepSpeed's own ``scheduler`` types do not offer) as a factory for deepspeed.initialize."""
    allowed = {"type", "warmup_proportion", "total_steps", "degree"}
    if not isinstance(section, dict) or str(section.get("type", "")).lower() != "polywarmup":
        raise ValueError(f"lr_schedule must be {{'type': 'PolyWarmUp', ...}}, got {section!r}")
    unknown = sorted(set(section) - allowed)
    if unknown or "warmup_proportion" not in section or "total_steps" not in section:
        raise ValueError(f"lr_schedule: unknown key(s) {unknown} or missing warmup_proportion/total_steps; "
                         f"allowed keys: {sorted(allowed)}")
    kwargs = {"warmup_proportion": float(section["warmup_proportion"]), "total_steps": section["total_steps"],
              "degree": float(section.get("degree", 0.5))}
    PolyWarmUpScheduler(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), **kwargs)  # validate now
    return lambda optimizer: PolyWarmUpScheduler(optimizer, **kwargs)
