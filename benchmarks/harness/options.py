"""Names benchmark flags and tables use for kaisa_ds's options, mapped to kaisa_ds's own values at the CLI
boundary: dtype names (kaisa_ds.config's map) and KAISA's strategies (kaisa_ds.enums)."""

from __future__ import annotations

import torch

from kaisa_ds.enums import DTYPES, DistributedStrategy, parse_dtype

DTYPE_NAMES = ("fp32", "fp16", "bf16")  # what dtype flags accept; each a name in kaisa_ds.enums.DTYPES
# KAISA's names in tables and flags, in the order the benchmarks run them
STRATEGIES: dict[str, DistributedStrategy] = {"MEM-OPT": DistributedStrategy.MEM_OPT,
                                              "HYBRID-OPT": DistributedStrategy.HYBRID_OPT,
                                              "COMM-OPT": DistributedStrategy.COMM_OPT}


def dtype_name(value: torch.dtype | str | None, *, name: str) -> str | None:
    """The flag name of a config's dtype (None stays None), so reports hold the names the flags take, not torch
    objects; ``name`` is the option's, for the error."""
    dtype = parse_dtype(value, name=name, allow_none=True)
    if dtype is None:
        return None
    for flag in DTYPE_NAMES:
        if DTYPES[flag] == dtype:
            return flag
    raise ValueError(f"{name}={value!r} has no benchmark flag name; allowed: {', '.join(DTYPE_NAMES)}")


def autocast_dtype(name: str) -> torch.dtype | None:
    """The autocast dtype of a ``--dtype`` name; None for fp32 (no autocast)."""
    dtype = DTYPES[name]
    return None if dtype == torch.float32 else dtype
