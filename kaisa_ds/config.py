"""The one validated K-FAC configuration, shared by the Python API and the DeepSpeed ``kfac`` section."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kaisa_ds.enums import ComputeMethod, DampingMode, DistributedStrategy, LossReduction, parse_enum
from kaisa_ds.schedules import Scalar, ScheduleLike, evaluate, schedule_from_spec

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
}
STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
GradWorkerFraction = float | DistributedStrategy | str
# Relative damping in force when no damping option is given: γ = 100 × each layer's mean eigenvalue of A ⊗ G. The
# convergence study's tuned absolute dampings, measured on BERT-tiny's tune part, are relative ~95 (large batch,
# 1e-6) and ~6e4 (small batch, 1e-4) as medians over layers (benchmarks/results/damping_scale.json).
DEFAULT_RELATIVE_DAMPING = 100.0
DEFAULT_ABSOLUTE_DAMPING = 0.001  # ``damping_mode="absolute"`` without ``damping``: the old library default

# (lower, upper, lower inclusive) for each scheduled hyperparameter; checked whenever a value is evaluated.
_RANGES: dict[str, tuple[float, float, bool]] = {
    "damping": (0.0, math.inf, False),
    "relative_damping": (0.0, math.inf, False),
    "factor_decay": (0.0, 1.0, True),
    "kl_clip": (0.0, math.inf, False),
    "lr": (0.0, math.inf, True),
    "factor_update_steps": (1, math.inf, True),
    "inv_update_steps": (1, math.inf, True),
}
_RANGE_TEXT = {
    "damping": "> 0", "relative_damping": "> 0", "factor_decay": "in [0, 1)", "kl_clip": "> 0 (or None to disable)",
    "lr": ">= 0",
    "factor_update_steps": "an integer >= 1", "inv_update_steps": "an integer >= 1",
}


def parse_dtype(value: torch.dtype | str | None, *, name: str, allow_none: bool = False) -> torch.dtype | None:
    """A torch dtype from a dtype or its name (``fp16``, ``bfloat16``, ...)."""
    if value is None and allow_none:
        return None
    if isinstance(value, torch.dtype) and value in STORAGE_DTYPES:
        return value
    if isinstance(value, str) and value.lower().removeprefix("torch.") in DTYPES:
        return DTYPES[value.lower().removeprefix("torch.")]
    raise ValueError(f"{name}={value!r} is not valid; allowed values: fp32, fp16, bf16, fp64" +
                     (" or None" if allow_none else ""))


def check_range(name: str, value: Scalar | None) -> Scalar | None:
    """Raise ValueError naming ``name`` and its allowed range when ``value`` is outside it."""
    if value is None and name in ("kl_clip", "damping", "relative_damping"):
        return None
    lo, hi, lo_incl = _RANGES[name]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and name.endswith("_steps"):
        ok = float(value).is_integer()  # type: ignore[arg-type]
    if ok:
        ok = (value >= lo if lo_incl else value > lo) and value < hi  # type: ignore[operator]
    if not ok:
        raise ValueError(f"{name}={value!r} is not valid; allowed: {_RANGE_TEXT[name]}")
    return value


@dataclass(frozen=True)
class Damping:
    """The damping in force at one step: its value and what it is measured against (:class:`DampingMode`). How it
    shifts each layer's curvature is :mod:`kaisa_ds.decomposition.damping`."""

    mode: DampingMode
    value: float

    @property
    def relative(self) -> bool:
        return self.mode is DampingMode.RELATIVE

    def describe(self) -> str:
        if self.relative:
            return f"relative_damping={self.value:g} (× each layer's mean eigenvalue of A ⊗ G)"
        return f"damping={self.value:g} (absolute)"


def _share(name: str, value: Any, of_what: str) -> float:
    """A share in (0, 1] as a float; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name}={value!r} is not valid; allowed: a number in (0, 1] (the share {of_what}; "
                         "1 = all, exact)")
    return float(value)


@dataclass
class KFACConfig:
    """Every K-FAC option, validated once at construction.

    Scheduled options (``damping``, ``relative_damping``, ``factor_decay``, ``kl_clip``, ``lr``,
    ``factor_update_steps``, ``inv_update_steps``) take a number or a callable ``step -> value``; callables are
    range-checked each time they are evaluated (:meth:`value`).

    Damping (see :class:`~kaisa_ds.enums.DampingMode`): ``damping`` is ABSOLUTE (added to the eigenvalues as
    given, as before); ``relative_damping`` is a multiple of each layer's own curvature scale, so the loss's scale
    does not matter. Neither given: relative, :data:`DEFAULT_RELATIVE_DAMPING`. ``damping_mode="absolute"``
    without ``damping``: :data:`DEFAULT_ABSOLUTE_DAMPING`. Giving both values, or a mode that contradicts the
    value given, is an error.
    """

    factor_update_steps: ScheduleLike = 1
    inv_update_steps: ScheduleLike = 1
    damping: ScheduleLike | None = None  # absolute; None: see relative_damping
    relative_damping: ScheduleLike | None = None
    damping_mode: DampingMode | str | None = None  # None: absolute when damping is given, else relative
    factor_decay: ScheduleLike = 0.95
    kl_clip: ScheduleLike | None = 0.001
    lr: ScheduleLike = 0.1
    compute_method: ComputeMethod | str = ComputeMethod.EIGEN
    grad_worker_fraction: GradWorkerFraction = 1.0
    factor_dtype: torch.dtype | str | None = None
    inv_dtype: torch.dtype | str = torch.float32
    decomposition_dtype: torch.dtype | str = torch.float32
    skip_layers: tuple[str, ...] | list[str] | str = ()
    symmetry_aware: bool = False
    allreduce_bucket_cap_mb: float = 25.0
    overlap_factor_reduction: bool = False  # opt-in: no gain on CPU ranks (benchmarks.overlap); for NCCL on GPUs
    accumulation_steps: int | None = None  # backward passes per step(); None: unknown, so no overlap
    loss_scale: Callable[[], float] | None = None
    loss_reduction: LossReduction | str = LossReduction.MEAN
    factor_sample_fraction: float = 1.0
    factor_pass_fraction: float = 1.0
    max_decomposition_failures: int = 5
    _compiled_skip: list[re.Pattern[str]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.compute_method = parse_enum(ComputeMethod, self.compute_method, name="compute_method")
        self.loss_reduction = parse_enum(LossReduction, self.loss_reduction, name="loss_reduction")
        if self.damping_mode is not None:
            self.damping_mode = parse_enum(DampingMode, self.damping_mode, name="damping_mode")
        conflict = damping_conflict(self.damping, self.relative_damping, self.damping_mode, prefix="")
        if conflict:
            raise ValueError(conflict)
        self.factor_dtype = parse_dtype(self.factor_dtype, name="factor_dtype", allow_none=True)
        self.inv_dtype = parse_dtype(self.inv_dtype, name="inv_dtype") or torch.float32
        self.decomposition_dtype = parse_dtype(self.decomposition_dtype, name="decomposition_dtype") or torch.float32
        if self.decomposition_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"decomposition_dtype={self.decomposition_dtype} is not valid; allowed: fp32, fp64")
        self.grad_worker_fraction = self._parse_fraction(self.grad_worker_fraction)
        if isinstance(self.skip_layers, str):
            self.skip_layers = (self.skip_layers,)
        self.skip_layers = tuple(self.skip_layers)
        try:
            self._compiled_skip = [re.compile(p) for p in self.skip_layers]
        except re.error as exc:
            raise ValueError(f"skip_layers contains an invalid regular expression: {exc}") from exc
        if not isinstance(self.symmetry_aware, bool):
            raise ValueError(f"symmetry_aware={self.symmetry_aware!r} is not valid; allowed: true or false")
        if not isinstance(self.overlap_factor_reduction, bool):
            raise ValueError(f"overlap_factor_reduction={self.overlap_factor_reduction!r} is not valid; allowed: true "
                             "or false")
        steps = self.accumulation_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"accumulation_steps={steps!r} is not valid; allowed: an integer >= 1 (backward passes "
                             "per step(); under DeepSpeed it is taken from gradient_accumulation_steps) or null")
        cap = self.allreduce_bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise ValueError(f"allreduce_bucket_cap_mb={cap!r} is not valid; allowed: a number > 0")
        self.factor_sample_fraction = _share("factor_sample_fraction", self.factor_sample_fraction,
                                             "of tokens whose statistics feed the factors")
        self.factor_pass_fraction = _share("factor_pass_fraction", self.factor_pass_fraction,
                                           "of an accumulation window's backward passes whose statistics feed the "
                                           "factors")
        limit = self.max_decomposition_failures
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_decomposition_failures={limit!r} is not valid; allowed: an integer >= 1 (the "
                             "consecutive failed decompositions of one factor after which training stops)")
        if self.loss_scale is not None and not callable(self.loss_scale):
            raise ValueError("loss_scale must be None or a callable returning the current loss scale")
        for name in _RANGES:
            raw = getattr(self, name)
            if not callable(raw):
                check_range(name, raw)

    @staticmethod
    def _parse_fraction(value: GradWorkerFraction) -> float | DistributedStrategy:
        if isinstance(value, str) and not isinstance(value, DistributedStrategy):
            return parse_enum(DistributedStrategy, value, name="grad_worker_fraction")
        if isinstance(value, DistributedStrategy):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(
                f"grad_worker_fraction={value!r} is not valid; allowed: a float in [1/world_size, 1] "
                "or 'comm-opt', 'hybrid-opt', 'mem-opt'"
            )
        return float(value)

    def value(self, name: str, step: int) -> Any:
        """The range-checked value of scheduled option ``name`` at ``step``."""
        raw = evaluate(getattr(self, name), step)
        checked = check_range(name, raw)
        return int(checked) if name.endswith("_steps") and checked is not None else checked

    @property
    def mode(self) -> DampingMode:
        """The damping mode in force (``damping_mode``, or what the value given implies)."""
        if isinstance(self.damping_mode, DampingMode):
            return self.damping_mode
        return DampingMode.ABSOLUTE if self.damping is not None else DampingMode.RELATIVE

    def damping_at(self, step: int) -> Damping:
        """The damping in force at ``step``: its mode and its range-checked value."""
        if self.mode is DampingMode.ABSOLUTE:
            value = DEFAULT_ABSOLUTE_DAMPING if self.damping is None else self.value("damping", step)
        else:
            value = (DEFAULT_RELATIVE_DAMPING if self.relative_damping is None
                     else self.value("relative_damping", step))
        return Damping(self.mode, float(value))

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """Factor storage dtype (None: the statistics' own FP32)."""
        return self.factor_dtype if isinstance(self.factor_dtype, torch.dtype) else None

    @property
    def method(self) -> ComputeMethod:
        return ComputeMethod(self.compute_method)

    def skips(self, module_name: str, class_name: str) -> bool:
        """True when a ``skip_layers`` regex matches the module's name or its class name."""
        return any(p.search(module_name) or p.fullmatch(class_name) for p in self._compiled_skip)

    @classmethod
    def from_dict(cls, section: Mapping[str, Any], **overrides: Any) -> KFACConfig:
        """Build from a JSON-style mapping (the DeepSpeed ``kfac`` section, without ``enabled``).

        Unknown keys and wrong types fail here, naming the key and the allowed values.
        """
        names = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "loss_scale"}
        unknown = sorted(set(section) - names)
        if unknown:
            raise ValueError(f"kfac: unknown key(s) {unknown}; allowed keys: {sorted(names | {'enabled'})}")
        conflict = damping_conflict(section.get("damping"), section.get("relative_damping"),
                                    section.get("damping_mode"), prefix="kfac.")
        if conflict:
            raise ValueError(conflict)
        kwargs: dict[str, Any] = {}
        for key, val in section.items():
            if key in ("damping", "relative_damping", "factor_decay", "kl_clip", "lr") and val is not None:
                val = schedule_from_spec(val, name=f"kfac.{key}")
            elif key in ("factor_update_steps", "inv_update_steps"):
                val = schedule_from_spec(val, name=f"kfac.{key}", integer=True)
            elif key == "skip_layers" and not (
                isinstance(val, str) or (isinstance(val, list) and all(isinstance(v, str) for v in val))
            ):
                raise ValueError(f"kfac.skip_layers must be a list of regular expressions, got {val!r}")
            kwargs[key] = val
        kwargs.update(overrides)
        try:
            return cls(**kwargs)
        except ValueError as exc:  # every field's message starts with its name: make it the config key
            text = str(exc)
            lead = re.match(r"\w+", text)
            raise ValueError(f"kfac.{text}" if lead and lead.group() in names else f"kfac: {text}") from exc


def damping_conflict(damping: Any, relative: Any, mode: Any, *, prefix: str) -> str | None:
    """Why the damping options given contradict each other (None when they do not); names ``prefix + key``."""
    if damping is not None and relative is not None:
        return (f"{prefix}damping and {prefix}relative_damping are both given: {prefix}damping is absolute, "
                f"{prefix}relative_damping is relative to each layer's curvature scale; keep one of them")
    try:
        parsed = parse_enum(DampingMode, mode, name="damping_mode") if mode else None
    except ValueError:
        parsed = None  # not a mode at all: the field's own check names it
    if parsed is DampingMode.RELATIVE and damping is not None:
        return (f"{prefix}damping_mode='relative' with {prefix}damping given ({prefix}damping is absolute): give "
                f"{prefix}relative_damping instead, or drop {prefix}damping_mode")
    if parsed is DampingMode.ABSOLUTE and relative is not None:
        return (f"{prefix}damping_mode='absolute' with {prefix}relative_damping given: give {prefix}damping "
                f"instead, or drop {prefix}damping_mode")
    return None
