"""Enum-like options. Each enum also accepts its string value (case-insensitive), as kfac-pytorch does."""

from __future__ import annotations

import enum
from typing import Any, TypeVar

import torch

E = TypeVar("E", bound=enum.Enum)


class ComputeMethod(str, enum.Enum):
    """How a layer's Kronecker factors are turned into a preconditioner (``KFACConfig.compute_method``).

    ``eigen`` (the default): eigendecompositions of A and G; the damping is added to the eigenvalues of ``A ⊗ G``
    at preconditioning, so changing it needs no new decomposition. ``eigen-refresh``: the same eigenbasis, exact
    once, then updated from the basis in force (a few matmuls and a QR, or kept where it is still right;
    :mod:`kaisa_ds.decomposition.refresh`). ``inverse``: damped inverses ``(A + γ_A I)⁻¹`` and ``(G + γ_G I)⁻¹``,
    cheaper to apply, the damping fixed at decomposition.
    """

    EIGEN = "eigen"
    EIGEN_REFRESH = "eigen-refresh"
    INVERSE = "inverse"


class DistributedStrategy(str, enum.Enum):
    """KAISA's named points on the memory/communication trade-off (``KFACConfig.grad_worker_fraction``).

    ``comm-opt``: every rank holds every decomposition and preconditions every layer (fraction 1: most memory, no
    gradient broadcast). ``mem-opt``: one rank per layer decomposes, preconditions and broadcasts its gradient
    (fraction 1/world: least memory). ``hybrid-opt``: half the ranks per layer (fraction 1/2). ``auto`` (the
    default): ``mem-opt`` on CPU ranks (gloo), where the per-step matmuls of COMM-OPT would run on every rank on
    the same scarce cores while a broadcast is a local copy; ``comm-opt`` elsewhere (KAISA's and kfac-pytorch's
    default on GPUs).
    """

    COMM_OPT = "comm-opt"  # fraction 1: every rank holds every decomposition
    HYBRID_OPT = "hybrid-opt"  # fraction 1/2 (when the world size allows it)
    MEM_OPT = "mem-opt"  # fraction 1/world: one rank per layer preconditions and broadcasts
    AUTO = "auto"  # mem-opt on CPU ranks, comm-opt on accelerators (resolve_grad_workers)


class LambImplementation(str, enum.Enum):
    """Which LAMB ``kaisa_ds.optim.build_lamb`` builds (``optimizer.params.implementation`` in a DeepSpeed config).

    ``auto`` (the default): NVIDIA Apex's FusedLAMB when importable, else kaisa_ds's own LAMB: both follow Apex's
    semantics, so a learning rate tuned on one device holds on the other. ``deepspeed``: DeepSpeed's FusedLamb
    (CUDA, JIT-built), faster than the pure-PyTorch LAMB but a different algorithm: its trust-ratio step is
    multiplied by ``sqrt(1-β₂ᵗ)/(1-β₁ᵗ)`` (≈0.3 at step 1, → 1 later), the ratio clamped to [min_coeff, max_coeff].
    ``apex`` and ``torch`` ask for one of the two Apex-semantics implementations by name.
    """

    AUTO = "auto"
    APEX = "apex"
    DEEPSPEED = "deepspeed"
    TORCH = "torch"


class DampingMode(str, enum.Enum):
    """What a damping value is measured against.

    ``relative`` (the default): a multiple of each layer's own curvature scale, the mean eigenvalue of A ⊗ G
    (``trace(A)/dim_A · trace(G)/dim_G``), so multiplying the loss by any constant leaves every layer's
    preconditioned direction unchanged. ``absolute``: the number itself, added to the eigenvalues as given
    (the library's behaviour before relative damping; its value depends on how the loss is scaled).
    """

    RELATIVE = "relative"
    ABSOLUTE = "absolute"


class Eigenvalues(str, enum.Enum):
    """What divides each entry of a gradient rotated into K-FAC's eigenbasis (``KFACConfig.eigenvalues``).

    ``kronecker``: K-FAC's own ``λ_G,i λ_A,j + γ``, the Kronecker product's estimate of that entry's second moment,
    damped. ``adaptive``: ``√v̂``, the entry's measured second moment (a running average of its squares), as
    EKFAC's eigenvalue correction with Adam's root, which SOAP runs in Shampoo's basis; no damping.
    """

    KRONECKER = "kronecker"
    ADAPTIVE = "adaptive"


class Grafting(str, enum.Enum):
    """What sets the size of each layer's preconditioned gradient (``KFACConfig.grafting``).

    ``gradient`` (the default since 2026-11-28, benchmarks/results/convergence/defaults_rule_6.md): each layer's
    preconditioned gradient is rescaled to the norm of its raw gradient (Shampoo's "grafting": K-FAC chooses the
    direction, the gradient its size), so the optimizer after it sees the scale it would have seen without K-FAC;
    the KL clip is off unless set (``kl_clip="auto"``). ``none``: the preconditioner's own size, bounded by the KL
    clip (KAISA's step). Under LAMB that size mostly does not reach the step (LAMB normalises each tensor), but
    K-FAC enlarges the encoder's gradients ~10⁵×, and after LAMB's global-norm pre-normalisation the tensors it
    enlarges least (the word embeddings, the MLM output bias) fall below Adam's eps and barely learn: a regulariser
    where text repeats, a lag where it does not (benchmarks/README.md, "Size or direction"). ``kfac-size``: an
    ablation, the raw gradient's direction at the size K-FAC's step has (KL clip included): what K-FAC gives
    without its curvature.
    """

    NONE = "none"
    GRADIENT = "gradient"
    KFAC_SIZE = "kfac-size"


class LossReduction(str, enum.Enum):
    """How the training loss was reduced over samples; sets the per-sample scaling of output gradients.

    ``mean``: the loss is averaged over the micro-batch (and divided by the number of accumulation
    passes); output gradients are multiplied by the micro-batch size and by the number of passes.
    ``sum``: the loss is summed over samples; output gradients are already per-sample.
    """

    MEAN = "mean"
    SUM = "sum"


def parse_enum(enum_cls: type[E], value: E | str, *, name: str) -> E:
    """Return ``value`` as a member of ``enum_cls``; raise ValueError naming ``name`` and the choices."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("_", "-")
        for member in enum_cls:
            if str(member.value).lower().replace("_", "-") == key:
                return member
    choices = ", ".join(repr(m.value) for m in enum_cls)
    raise ValueError(f"{name}={value!r} is not valid; allowed values: {choices}")


DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
}
STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


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


def parse_share(name: str, value: Any, of_what: str) -> float:
    """A share in (0, 1] as a float; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name}={value!r} is not valid; allowed: a number in (0, 1] (the share {of_what}; "
                         "1 = all, exact)")
    return float(value)


def parse_bound(name: str, value: Any, *, low: float, inclusive: bool, meaning: str, allow_none: bool) -> Any:
    """A number above ``low`` (or equal to it when ``inclusive``), or None when ``allow_none``; ValueError naming
    ``name`` and what the number means otherwise."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= low if inclusive else
                                                                              value > low):
        raise ValueError(f"{name}={value!r} is not valid; allowed: a number {'>=' if inclusive else '>'} {low:g} "
                         f"({meaning})" + (" or null" if allow_none else ""))
    return value


def parse_count(name: str, value: Any, *, meaning: str, allow_none: bool = False) -> int | None:
    """An integer >= 1 (or None when ``allow_none``); ValueError naming ``name`` and what the count means."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not valid; allowed: an integer >= 1 ({meaning})"
                         + (" or null" if allow_none else ""))
    return value


def parse_worker_fraction(value: Any) -> float | DistributedStrategy:
    """``grad_worker_fraction``: a share of ranks in (0, 1] as a float, or a :class:`DistributedStrategy` (also its
    string value); ValueError naming the option otherwise."""
    if isinstance(value, DistributedStrategy):
        return value
    if isinstance(value, str):
        return parse_enum(DistributedStrategy, value, name="grad_worker_fraction")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"grad_worker_fraction={value!r} is not valid; allowed: a float in [1/world_size, 1] "
                         "or 'auto', 'comm-opt', 'hybrid-opt', 'mem-opt'")
    return float(value)


COUNTS = (("accumulation_steps", True, "backward passes per step(); under DeepSpeed, gradient_accumulation_steps"),
          ("max_decomposition_failures", False, "failed decompositions of one factor in a row that stop training"),
          ("max_factor_dim", True, "the largest factor kept whole; larger ones keep their diagonal"),
          ("max_statistic_rows", True, "rows one factor update takes in over every rank; more are sampled down"))
BOUNDS = (("allreduce_bucket_cap_mb", 0, False, False, "payload per bucket of factor all-reduces, in MiB"),
          ("max_factor_ratio", 1, True, True, "a dense factor more than this many times its layer's other side keeps "
                                              "only its diagonal"))
SHARES = (("factor_sample_fraction", "of tokens whose statistics feed the factors"),
          ("factor_pass_fraction", "of an accumulation window's backward passes whose statistics feed the factors"),
          ("decomposition_budget", "of a training step decompositions may cost"))


def checked_numbers(options: object) -> dict[str, Any]:
    """Every numeric option of ``options`` (a :class:`~kaisa_ds.config.KFACConfig`) range-checked, shares as
    floats: counts, shares and bounded numbers, each ValueError naming its option and what it means."""
    out: dict[str, Any] = {}
    for name, allow_none, meaning in COUNTS:
        out[name] = parse_count(name, getattr(options, name), allow_none=allow_none, meaning=meaning)
    for name, of_what in SHARES:
        out[name] = parse_share(name, getattr(options, name), of_what)
    for name, low, inclusive, allow_none, meaning in BOUNDS:
        out[name] = parse_bound(name, getattr(options, name), low=low, inclusive=inclusive, meaning=meaning,
                                allow_none=allow_none)
    return out
