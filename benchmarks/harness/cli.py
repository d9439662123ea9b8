"""Command lines of the benchmarks: the parser every benchmark starts from (``--out``), and the flags of the
side-by-side step timings (``benchmarks.step_cost``, ``benchmarks.versus_kfac_pytorch``) with their checks."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import torch

from benchmarks.harness.interval import Interval
from benchmarks.harness.options import DTYPE_NAMES
from benchmarks.harness.output import RESULTS
from kaisa_ds.plan.bert_sizes import SIZES

_EMPTY: Mapping[str, str] = {}


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose --help shows the module docstring, with the common ``--out``."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS / f"{name}.json", help="JSON output (default: %(default)s)")
    return p


def add_side_by_side_flags(p: argparse.ArgumentParser, *, help_for: Mapping[str, str] = _EMPTY) -> None:
    """The model, batch, K-FAC interval and measurement flags of a side-by-side step timing. ``help_for``: a
    benchmark's own help text of a flag (``--lr``, ``--sample-fraction``, ``--inv-dtype``) where it means more there."""
    def helps(flag: str, default: str) -> str:
        return help_for.get(flag, default)

    p.add_argument("--size", default="mini", choices=list(SIZES), help="BERT size (default: %(default)s)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--lr", type=float, default=1e-3, help=helps("--lr", "K-FAC's lr for the KL clip"))
    p.add_argument("--factor-every", type=int, default=5, help="factor_update_steps (default: %(default)s)")
    p.add_argument("--inv-every", type=int, default=50, help="inv_update_steps (default: %(default)s)")
    p.add_argument("--sample-fraction", type=float, default=1.0, help=helps(
        "--sample-fraction", "factor_sample_fraction: share of tokens feeding the factor statistics (default 1: all)"))
    p.add_argument("--inv-dtype", default="fp32", choices=list(DTYPE_NAMES), help=helps(
        "--inv-dtype", "K-FAC inv_dtype: decompositions stored and applied in this dtype (default fp32)"))
    p.add_argument("--repeats", type=int, default=7, help="measured rounds; medians are reported")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own choice, one per core)")


def check_side_by_side_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad values of :func:`add_side_by_side_flags`'s flags (usage error, exit 2, before anything is built)
    and fill in the device."""
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1 and --warmup >= 0")
    if args.batch < 1 or args.seq < 2 or args.vocab < 2:
        p.error("--batch must be >= 1, --seq >= 2 and --vocab >= 2")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    try:
        Interval(args.factor_every, args.inv_every)
    except ValueError as exc:
        p.error(str(exc))
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
