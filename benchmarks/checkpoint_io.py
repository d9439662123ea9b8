"""K-FAC checkpoint I/O per rank at BERT-Large factor shapes: the previous format against the sharded one.

previous  every rank calls ``precond.state_dict()`` (every decomposition gathered onto every rank as CPU copies)
          and rank 0 ``torch.save``s it inside DeepSpeed's model-states file (``client_state``);
sharded   ``kaisa_ds.checkpoint.shards.save_shards``: each rank writes the factors it decomposes and their
          decompositions, rank 0 a small JSON index.

Two tables:
1. **Exact byte counts for the whole BERT-Large encoder** (24 layers, KAISA's skip list), simulated: the real
   work assignment (``kaisa_ds.distributed.assignment.assign_work``) is run for each world size without ranks,
   and each rank's bytes are the tensor bytes it would write (file-format overhead, a few KB, left out).
2. **Measured** on real gloo ranks (fresh processes, one per rank, one per format): ``--layers`` synthetic encoder
   layers with BERT-Large's Linear shapes (q/k/v 1024→1024 sharing their input, attention output 1024→1024,
   intermediate 1024→4096, output 4096→1024), factors and decompositions filled with random values of the
   configured dtypes (no eigendecomposition is run: only the bytes matter), then one save. Recorded per rank:
   bytes written, and the save's peak host memory above the resident set just before it (the kernel's peak RSS,
   ``VmHWM``, reset right before the save through ``/proc/self/clear_refs``, minus the RSS then).

Defaults are the shipped BERT-Large K-FAC config (ds_configs/bert_large_*_phase1_kfac.json): fp16 factors, bf16
decompositions, grad_worker_fraction 0.5 (1 on a single rank).

    python -m benchmarks.checkpoint_io                       # worlds 1 2 4, 2 measured layers
    python -m benchmarks.checkpoint_io --factor-dtype fp32 --inv-dtype fp32 --layers 1
"""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.memory import MB, peak_rss_bytes, reset_peak_rss, rss_bytes
from benchmarks.harness.options import DTYPE_NAMES
from benchmarks.harness.output import publish, table
from benchmarks.harness.processes import spawn
from kaisa_ds.enums import DTYPES

HIDDEN, INTER, LAYERS = 1024, 4096, 24


class EncoderLinears(nn.Module):
    """The Linear layers of one BERT-Large encoder layer, wired so that q/k/v read the same input."""

    def __init__(self, hidden: int = HIDDEN, inter: int = INTER) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attention_output = nn.Linear(hidden, hidden)
        self.intermediate = nn.Linear(hidden, inter)
        self.output = nn.Linear(inter, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_output(self.query(x) + self.key(x) + self.value(x))
        return self.output(torch.nn.functional.gelu(self.intermediate(h)))  # type: ignore[no-any-return]


def encoder_units(layers: int, hidden: int = HIDDEN, inter: int = INTER) -> list[Any]:
    """The work units K-FAC builds for ``layers`` encoder layers (factor names, sizes with the bias column)."""
    from kaisa_ds.distributed.assignment import WorkUnit

    units = []
    for i in range(layers):
        p = f"layer{i}"
        units.append(WorkUnit(f"{p}.qkv", ((f"{p}.qkv.A", hidden + 1, False), (f"{p}.query.G", hidden, False),
                                           (f"{p}.key.G", hidden, False), (f"{p}.value.G", hidden, False))))
        units.append(WorkUnit(f"{p}.ao", ((f"{p}.ao.A", hidden + 1, False), (f"{p}.ao.G", hidden, False))))
        units.append(WorkUnit(f"{p}.inter", ((f"{p}.inter.A", hidden + 1, False), (f"{p}.inter.G", inter, False))))
        units.append(WorkUnit(f"{p}.out", ((f"{p}.out.A", inter + 1, False), (f"{p}.out.G", hidden, False))))
    return units


def fraction_for(fraction: float, world: int) -> float:
    return max(fraction, 1.0 / world)


def simulate(*, layers: int, world: int, fraction: float, factor_bytes: int, inv_bytes: int, hidden: int = HIDDEN,
             inter: int = INTER) -> dict[str, Any]:
    """Per-rank bytes of both formats from the real assignment, without ranks."""
    from kaisa_ds.distributed.assignment import assign_work, resolve_grad_workers

    units = encoder_units(layers, hidden, inter)
    grad_workers = resolve_grad_workers(fraction_for(fraction, world), world)
    assignment = assign_work(units, world=world, grad_workers=grad_workers)
    dims = {f: d for u in units for f, d, _ in u.factors}
    per_factor = {f: d * d * factor_bytes + (d * d + d) * inv_bytes for f, d in dims.items()}
    shard = [0] * world
    for f, r in assignment.inverse_worker.items():
        shard[r] += per_factor[f]
    total = sum(per_factor.values())
    return {"world": world, "grad_workers": grad_workers, "old_written_rank0_MB": total / MB,
            "old_host_copy_per_rank_MB": total / MB, "new_written_max_MB": max(shard) / MB,
            "new_written_mean_MB": sum(shard) / world / MB, "new_max_over_old": max(shard) / total}


def _fill(precond: Any, inv_dtype: torch.dtype) -> None:
    """Random factors (every rank holds all) and decompositions (the ones this rank holds), in place."""
    from kaisa_ds.decomposition.tensors import Decomposition

    s = precond.ensure_structure()
    gen = torch.Generator().manual_seed(precond.rank)
    for name, f in s.factors().items():
        f.value = torch.empty(f.dim, f.dim).normal_(generator=gen)
        if s.holds(name, precond.rank):
            precond.decompositions[name] = Decomposition(
                eigvecs=torch.empty(f.dim, f.dim, dtype=inv_dtype).normal_(generator=gen),
                eigvals=torch.empty(f.dim, dtype=inv_dtype).uniform_(generator=gen))


def _measure(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    from kaisa_ds import KFACPreconditioner
    from kaisa_ds.checkpoint.shards import META, save_shards, shard_name
    from kaisa_ds.engine.checkpoint import CLIENT_KEY

    torch.manual_seed(0)
    model = nn.Sequential(*(EncoderLinears(cfg["hidden"], cfg["inter"]) for _ in range(cfg["layers"])))
    precond = KFACPreconditioner(model, factor_dtype=cfg["factor_dtype"], inv_dtype=cfg["inv_dtype"],
                                 grad_worker_fraction=fraction_for(cfg["fraction"], world))
    model(torch.randn(1, cfg["hidden"])).sum().backward()  # the hooks fire: the structure can be built
    _fill(precond, DTYPES[cfg["inv_dtype"]])
    precond.discard_window()  # that pass's statistics: not part of a checkpoint
    model.zero_grad(set_to_none=True)
    gc.collect()
    folder = Path(cfg["folder"]) / f"{cfg['format']}_w{world}"
    folder.mkdir(parents=True, exist_ok=True)
    if world > 1:
        torch.distributed.barrier()
    reset_peak_rss()
    rss = rss_bytes()
    if cfg["format"] == "previous":
        state = precond.state_dict()  # a collective: every rank gathers every decomposition
        written = folder / "mp_rank_00_model_states.pt"
        if rank == 0:
            torch.save({"module": {}, CLIENT_KEY: state}, written)
        del state
        files = [written] if rank == 0 else []
    else:
        save_shards(precond, folder)
        files = [folder / shard_name(rank, world)] + ([folder / META] if rank == 0 else [])
    peak = peak_rss_bytes()
    held = precond.memory_usage()
    return {"written_MB": sum(f.stat().st_size for f in files) / MB, "save_peak_MB": (peak - rss) / MB,
            "kfac_held_MB": (held["factors"] + held["decompositions"]) / MB}


def measured_rows(cfg: dict[str, Any], worlds: list[int], factor_bytes: int, inv_bytes: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in tqdm(worlds, desc="worlds"):
            row: dict[str, Any] = {"world": world}
            for fmt in ("previous", "sharded"):
                ranks = spawn(_measure, world, {**cfg, "format": fmt, "folder": tmp})
                row[f"{fmt}_written_max_MB"] = max(r["written_MB"] for r in ranks)
                row[f"{fmt}_save_peak_max_MB"] = max(r["save_peak_MB"] for r in ranks)
                row["kfac_held_max_MB"] = max(r["kfac_held_MB"] for r in ranks)
                row[f"{fmt}_ranks"] = ranks
            predicted = simulate(layers=cfg["layers"], world=world, fraction=cfg["fraction"], hidden=cfg["hidden"],
                                 inter=cfg["inter"], factor_bytes=factor_bytes, inv_bytes=inv_bytes)
            row["sharded_predicted_max_MB"] = predicted["new_written_max_MB"]
            row["written_ratio"] = row["sharded_written_max_MB"] / row["previous_written_max_MB"]
            row["peak_ratio"] = row["sharded_save_peak_max_MB"] / max(row["previous_save_peak_max_MB"], 1e-9)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("checkpoint_io", __doc__)
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--simulated-worlds", type=int, nargs="+", default=[1, 2, 4, 8, 64])
    p.add_argument("--layers", type=int, default=2, help="encoder layers measured on real ranks (default: %(default)s)")
    p.add_argument("--factor-dtype", default="fp16", choices=list(DTYPE_NAMES))
    p.add_argument("--inv-dtype", default="bf16", choices=list(DTYPE_NAMES))
    p.add_argument("--fraction", type=float, default=0.5, help="grad_worker_fraction (at least 1/world)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="hidden size (default: BERT-Large's %(default)s)")
    p.add_argument("--intermediate", type=int, default=INTER, help="intermediate size (default: %(default)s)")
    args = p.parse_args(argv)
    factor_bytes, inv_bytes = DTYPES[args.factor_dtype].itemsize, DTYPES[args.inv_dtype].itemsize
    shapes = {"hidden": args.hidden, "inter": args.intermediate}
    simulated = [simulate(layers=LAYERS, world=w, fraction=args.fraction, factor_bytes=factor_bytes,
                          inv_bytes=inv_bytes, **shapes) for w in args.simulated_worlds]
    cfg = {"layers": args.layers, "factor_dtype": args.factor_dtype, "inv_dtype": args.inv_dtype,
           "fraction": args.fraction, **shapes}
    measured = measured_rows(cfg, args.worlds, factor_bytes, inv_bytes)
    info = machine()
    text = "\n".join([
        f"K-FAC checkpoint I/O per rank: factors {args.factor_dtype}, decompositions {args.inv_dtype}, "
        f"grad_worker_fraction {args.fraction} (at least 1/world)", machine_line(info), "",
        f"1. BERT encoder ({LAYERS} layers, hidden {args.hidden}, intermediate {args.intermediate}), exact tensor "
        "bytes from the real assignment (simulated ranks)",
        table(simulated, ["world", "grad_workers", "old_written_rank0_MB", "old_host_copy_per_rank_MB",
                          "new_written_max_MB", "new_written_mean_MB", "new_max_over_old"]), "",
        f"2. Measured on real gloo ranks: {args.layers} encoder layer(s) of those shapes, one save",
        table(measured, ["world", "kfac_held_max_MB", "previous_written_max_MB", "sharded_written_max_MB",
                         "sharded_predicted_max_MB", "written_ratio", "previous_save_peak_max_MB",
                         "sharded_save_peak_max_MB", "peak_ratio"]),
    ])
    res = {"settings": vars(args) | {"out": str(args.out)}, "simulated": simulated, "measured": measured,
           "machine": info}
    publish(res, text, args.out)
    return res


if __name__ == "__main__":
    main()
