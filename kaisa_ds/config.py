"""The one validated K-FAC configuration, shared by the Python API and the DeepSpeed ``kfac`` section."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from kaisa_ds.damping import Damping, checked_options, damping_conflict, eigenvalues_in_force, in_force
from kaisa_ds.enums import (
    ComputeMethod,
    DampingMode,
    DistributedStrategy,
    Eigenvalues,
    Grafting,
    LossReduction,
    checked_numbers,
    parse_dtype,
    parse_enum,
    parse_worker_fraction,
)
from kaisa_ds.schedules import (
    AUTO,
    DECOMPOSITION_BUDGET,
    SCHEDULED,
    ScheduleLike,
    auto_inv_update_steps,
    check_range,
    evaluate,
    section_values,
)

GradWorkerFraction = float | DistributedStrategy | str
DEFAULT_KL_CLIP = 0.001  # ``kl_clip="auto"`` without grafting: KAISA's clip
DEFAULT_MAX_FACTOR_DIM = 8192  # 256 MiB in FP32: BERT-Large's 4,096 and GPT-2 XL's 6,400 are whole, a vocabulary not
DEFAULT_MAX_STATISTIC_ROWS = 2048  # rule 8: a quarter of the large regime's rows trained as well (defaults_rule_8.md)


@dataclass
class KFACConfig:
    """Every K-FAC option, validated once at construction (a bad value raises ValueError naming the option and
    its allowed values). Enum-like options also take their string values; after construction they are the enums.

    Scheduled options (``factor_update_steps``, ``inv_update_steps``, ``damping``, ``relative_damping``,
    ``factor_decay``, ``kl_clip``, ``lr``) take a number or a callable ``step -> value`` (KAISA's step decay:
    :class:`~kaisa_ds.schedules.StepSchedule`), range-checked when evaluated (:meth:`value`). Damping's defaults,
    and the options that contradict each other: :mod:`kaisa_ds.damping`.

    Args:
        factor_update_steps: steps between factor updates (statistics captured and folded into the running average).
        inv_update_steps: steps between decompositions of the factors (eigendecompositions or damped inverses);
            ``"auto"``: set from the statistic rows a factor update takes in (10 to 50 steps: longer for small,
            noisy batches), then lengthened if need be so that decompositions cost at most ``decomposition_budget``
            of a step, timed once on the run's own steps (:func:`~kaisa_ds.schedules.auto_inv_update_steps`).
        decomposition_budget: the share of a training step decompositions may cost under ``inv_update_steps``
            ``"auto"``.
        damping: absolute damping ``γ``, added to the eigenvalues of ``A ⊗ G`` (eigen) or to each factor's diagonal
            (inverse) as given; None: relative damping.
        relative_damping: damping as a multiple of each layer's mean eigenvalue of ``A ⊗ G``, so scaling the loss
            leaves every preconditioned direction unchanged.
        damping_mode: :class:`~kaisa_ds.enums.DampingMode`; None: absolute when ``damping`` is given, else relative.
        factor_decay: ``ξ`` of the running average ``F ← ξ F + (1 − ξ) F_new``, in [0, 1).
        kl_clip: bound on the KL size of the preconditioned step (KAISA's KL clip); None disables the clip;
            ``"auto"``: None under ``grafting="gradient"`` (the grafted size replaces the clip), else 0.001.
        grafting: :class:`~kaisa_ds.enums.Grafting`: what sets each layer's preconditioned gradient's size.
        eigenvalues: :class:`~kaisa_ds.enums.Eigenvalues`: what divides the gradient rotated into K-FAC's eigenbasis;
            ``"auto"``: ``adaptive``; ``kronecker`` where a damping, the inverse method or ``grafting="none"`` is given.
        lr: the learning rate the KL clip assumes (a number or ``step -> lr``; DeepSpeed passes the optimizer's).
        compute_method: :class:`~kaisa_ds.enums.ComputeMethod`: eigendecompositions, their warm-started refresh, or
            damped inverses; ``"auto"``: the refresh on CUDA (cheaper than eigh there), exact eigh elsewhere.
        grad_worker_fraction: share of ranks that precondition each layer, in [1/world, 1], or a
            :class:`~kaisa_ds.enums.DistributedStrategy` (``comm-opt`` 1, ``hybrid-opt`` 1/2, ``mem-opt`` 1/world,
            ``auto``: ``mem-opt`` on CPU ranks, ``comm-opt`` elsewhere). Every choice gives the same gradients.
        factor_dtype: storage dtype of the factors (``fp16``/``bf16`` keep a power-of-two scale); None: FP32.
        inv_dtype: dtype decompositions are stored and applied in; ``"auto"`` (None): :meth:`inv_dtype_on` decides.
        decomposition_dtype: dtype decompositions are computed in, ``fp32`` or ``fp64`` (a failure is retried in FP64).
        skip_layers: regular expressions; a module whose name (search) or class name (full match) matches is not
            preconditioned.
        symmetry_aware: all-reduce only the upper triangle of the symmetric factor statistics (about half the bytes).
        allreduce_bucket_cap_mb: payload per bucket of factor all-reduces, in MiB.
        overlap_factor_reduction: start the factor all-reduces during the window's last backward pass.
        accumulation_steps: backward passes per :meth:`KFACPreconditioner.step` (DeepSpeed: its
            ``gradient_accumulation_steps``); None: unknown, so no overlap.
        loss_scale: callable returning the current loss scale (fp16): gradients and G statistics are divided by it.
        loss_reduction: :class:`~kaisa_ds.enums.LossReduction`: how the loss was reduced over samples, which sets the
            per-sample scaling of output gradients.
        factor_sample_fraction: share of rows (tokens) whose statistics feed the factors; 1: all, exact.
        factor_pass_fraction: share of an accumulation window's backward passes whose statistics feed the factors.
        max_decomposition_failures: consecutive failed decompositions of one factor after which every rank stops
            with :class:`~kaisa_ds.diagnostics.DecompositionFailed`.
        max_factor_dim: the largest factor kept whole; a larger one keeps only its diagonal (an untied LM head's
            vocabulary-sized G: 32,000² floats are 4 GB and their eigendecomposition takes minutes). None: no limit.
        max_factor_ratio: a dense factor more than this many times its layer's other side keeps only its diagonal
            (one-sided rotation, as SOAP offers: a transformer MLP's 4× wider side). None: every factor whole up to
            max_factor_dim (both sides rotated, the default before amendment 9's reruns).
        max_statistic_rows: the most rows (tokens) one factor update takes in over every rank: past it, each pass's
            rows are sampled down (as ``factor_sample_fraction`` does) from the second update on, so the statistics'
            cost stops growing with the batch. None: every row.
    """

    factor_update_steps: ScheduleLike = 5  # 5 / 50: benchmarks/results/convergence/defaults_rule.md says how chosen
    inv_update_steps: ScheduleLike | str = AUTO  # defaults_rule_3.md: 50 at 2,048 rows per update, 10 at 8,192
    damping: ScheduleLike | None = None  # absolute; None: see relative_damping
    relative_damping: ScheduleLike | None = None
    damping_mode: DampingMode | str | None = None  # None: absolute when damping is given, else relative
    factor_decay: ScheduleLike = 0.95
    kl_clip: ScheduleLike | str | None = AUTO  # defaults_rule_6.md: none under the grafting the rule chose
    grafting: Grafting | str = Grafting.GRADIENT  # defaults_rule_6.md: E's sizes harmed where no text repeats
    eigenvalues: Eigenvalues | str = AUTO  # adaptive unless a damping asks for Kronecker (amendment 8)
    lr: ScheduleLike = 0.1
    compute_method: ComputeMethod | str = AUTO
    grad_worker_fraction: GradWorkerFraction = DistributedStrategy.AUTO  # benchmarks/README.md#strategy_cost
    factor_dtype: torch.dtype | str | None = None
    inv_dtype: torch.dtype | str | None = AUTO  # inv_dtype_on: bf16 on CUDA (0.5-0.7% gradient error), fp32 elsewhere
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
    max_factor_dim: int | None = DEFAULT_MAX_FACTOR_DIM
    max_factor_ratio: float | None = 2.0  # one-sided rotation: batch_scaling.md, Part 7 (amendment 9) and its reruns
    decomposition_budget: float = DECOMPOSITION_BUDGET
    max_statistic_rows: int | None = DEFAULT_MAX_STATISTIC_ROWS
    _compiled_skip: list[re.Pattern[str]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.compute_method != AUTO:
            try:
                self.compute_method = parse_enum(ComputeMethod, self.compute_method, name="compute_method")
            except ValueError as exc:
                raise ValueError(f"{exc}, or 'auto' (the refresh on CUDA, eigen elsewhere)") from None
        self.loss_reduction = parse_enum(LossReduction, self.loss_reduction, name="loss_reduction")
        self.grafting = parse_enum(Grafting, self.grafting, name="grafting")
        if isinstance(self.kl_clip, str) and self.kl_clip != AUTO:  # "auto" stays: value() resolves it (grafting)
            raise ValueError(f"kl_clip={self.kl_clip!r} is not valid; allowed: 'auto', a number > 0, a schedule "
                             "or null")
        self.damping_mode, self.eigenvalues = checked_options(self)
        self.factor_dtype = parse_dtype(self.factor_dtype, name="factor_dtype", allow_none=True)
        self.inv_dtype = None if self.inv_dtype in (None, AUTO) else parse_dtype(self.inv_dtype, name="inv_dtype")
        self.decomposition_dtype = parse_dtype(self.decomposition_dtype, name="decomposition_dtype") or torch.float32
        if self.decomposition_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"decomposition_dtype={self.decomposition_dtype} is not valid; allowed: fp32, fp64")
        self.grad_worker_fraction = parse_worker_fraction(self.grad_worker_fraction)
        self.skip_layers = (self.skip_layers,) if isinstance(self.skip_layers, str) else tuple(self.skip_layers)
        try:
            self._compiled_skip = [re.compile(p) for p in self.skip_layers]
        except re.error as exc:
            raise ValueError(f"skip_layers contains an invalid regular expression: {exc}") from exc
        for flag in ("symmetry_aware", "overlap_factor_reduction"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}={getattr(self, flag)!r} is not valid; allowed: true or false")
        for name, value in checked_numbers(self).items():
            setattr(self, name, value)
        if self.loss_scale is not None and not callable(self.loss_scale):
            raise ValueError("loss_scale must be None or a callable returning the current loss scale")
        if isinstance(self.inv_update_steps, str) and self.inv_update_steps != AUTO:
            raise ValueError(f"inv_update_steps={self.inv_update_steps!r} is not valid; allowed: 'auto' (set from "
                             "the batch), an integer >= 1, or a schedule")
        for name in SCHEDULED:
            raw = getattr(self, name)
            if not callable(raw) and raw != AUTO:
                check_range(name, raw)

    def value(self, name: str, step: int) -> Any:
        """The range-checked value of a scheduled option at a step.

        Args:
            name: a scheduled option (``damping``, ``lr``, ``inv_update_steps``, ...).
            step: the K-FAC step the value is for.
        """
        if getattr(self, name) == AUTO:
            if name == "kl_clip":  # defaults_rule_6.md: no clip under grafting, KAISA's without
                return None if self.grafting is Grafting.GRADIENT else DEFAULT_KL_CLIP
            raise ValueError(f"{name} is 'auto': it is known once the batch is (inv_update_steps_at)")
        raw = evaluate(getattr(self, name), step)
        checked = check_range(name, raw)
        return int(checked) if name.endswith("_steps") and checked is not None else checked

    def inv_dtype_on(self, device: torch.device | None) -> torch.dtype:
        """The dtype decompositions are stored in, ``"auto"`` resolved: BF16 on CUDA (gpu_suite.md), else FP32.

        Args:
            device: where the preconditioned layers live (None: a CPU).
        """
        if isinstance(self.inv_dtype, torch.dtype):
            return self.inv_dtype
        return torch.bfloat16 if device is not None and device.type == "cuda" else torch.float32

    @property
    def auto_interval(self) -> bool:
        """Whether ``inv_update_steps`` is ``"auto"`` (set by the statistic rows per factor update)."""
        return self.inv_update_steps == AUTO

    def inv_update_steps_at(self, step: int, *, rows: int | None, cost: int | None = None) -> int:
        """The decomposition interval in force at a step: the value given, or the ``"auto"`` interval for
        ``rows`` statistic rows per factor update (None, not known yet: its ceiling) and the cost rule's ``cost``.

        Args:
            step: the K-FAC step the interval is for.
            rows: statistic rows one factor update takes in over every rank (ignored unless ``"auto"``).
            cost: the cost rule's interval once the decompositions were timed (ignored unless ``"auto"``).
        """
        if not self.auto_interval:
            return int(self.value("inv_update_steps", step))
        return auto_inv_update_steps(rows=rows, factor_update_steps=self.value("factor_update_steps", step),
                                     cost=cost)

    @property
    def mode(self) -> DampingMode:
        """The damping mode in force (``damping_mode``, or what the value given implies)."""
        if isinstance(self.damping_mode, DampingMode):
            return self.damping_mode
        return DampingMode.ABSOLUTE if self.damping is not None else DampingMode.RELATIVE

    def damping_at(self, step: int) -> Damping:
        """The damping in force: its mode and its range-checked value.

        Args:
            step: the K-FAC step the damping is for.
        """
        absolute = self.mode is DampingMode.ABSOLUTE
        given = self.damping if absolute else self.relative_damping
        return in_force(self.mode, given=None if given is None else self.value("damping" if absolute else
                                                                               "relative_damping", step),
                        grafted=self.grafting is Grafting.GRADIENT)

    @property
    def scaling(self) -> Eigenvalues:
        """The eigenvalues in force (``eigenvalues`` with ``"auto"`` resolved)."""
        return eigenvalues_in_force(self)

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """Factor storage dtype (None: the statistics' own FP32)."""
        return self.factor_dtype if isinstance(self.factor_dtype, torch.dtype) else None

    @property
    def method(self) -> ComputeMethod:
        """``compute_method`` as the enum, ``"auto"`` as the eigen layout it has on every device."""
        return ComputeMethod.EIGEN if self.compute_method == AUTO else ComputeMethod(self.compute_method)

    def method_on(self, device: torch.device | None) -> ComputeMethod:
        """The method that runs on a device (``"auto"``: the eigenbasis refresh on CUDA, exact eigh elsewhere).

        Args:
            device: where the preconditioned layers live (None: a CPU).
        """
        cuda = device is not None and device.type == "cuda"
        return ComputeMethod.EIGEN_REFRESH if self.compute_method == AUTO and cuda else self.method

    def skips(self, module_name: str, class_name: str) -> bool:
        """Whether ``skip_layers`` excludes a module.

        Args:
            module_name: the module's name in ``model.named_modules()`` (a pattern matches it anywhere).
            class_name: the module's class name (a pattern must match it whole).
        """
        return any(p.search(module_name) or p.fullmatch(class_name) for p in self._compiled_skip)

    @classmethod
    def from_dict(cls, section: Mapping[str, Any], **overrides: Any) -> KFACConfig:
        """Build from a JSON-style mapping; unknown keys and wrong types fail here, naming ``kfac.<key>`` and the
        allowed values.

        Args:
            section: the DeepSpeed config's ``kfac`` section without ``enabled`` (and ``auto_step``); schedules as
                ``{"initial", "milestones", "factor"}``.
            overrides: options that replace the section's (e.g. ``loss_scale``, which JSON cannot hold).
        """
        names = {f.name for f in fields(cls) if f.init and f.name != "loss_scale"}
        values = section_values(section, keys=names)  # unknown keys first, then contradicting dampings
        conflict = damping_conflict(section.get("damping"), section.get("relative_damping"),
                                    section.get("damping_mode"), prefix="kfac.")
        if conflict:
            raise ValueError(conflict)
        try:
            return cls(**{**values, **overrides})
        except ValueError as exc:  # every field's message starts with its name: make it the config key
            text = str(exc)
            lead = re.match(r"\w+", text)
            raise ValueError(f"kfac.{text}" if lead and lead.group() in names else f"kfac: {text}") from exc
