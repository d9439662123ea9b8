"""The measurement of ``benchmarks.step_cost``: a baseline BERT and an identical K-FAC copy side by side, every
kind of step of a decomposition interval timed, aggregated and amortised over the interval."""

from __future__ import annotations

import argparse
import copy
import logging
import os
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.harness.batches import random_batch
from benchmarks.harness.interval import Interval, amortise
from benchmarks.harness.machine import machine
from benchmarks.harness.models import bert_for_pretraining
from benchmarks.harness.options import autocast_dtype
from benchmarks.harness.side_by_side import KaisaRunner, SideBySide
from benchmarks.harness.timing import median
from benchmarks.step_cost.calibration import calibration, decomposition_times
from kaisa_ds.plan.bert_sizes import KAISA_SKIP

logger = logging.getLogger(__name__)
# K-FAC stages of precond.timings that run inside precond.step() (factor capture runs inside forward/backward)
STEP_STAGES = ("factor_reduction", "decomposition", "preconditioning", "gradient_broadcast", "kl_clip", "write_grads")
COMPONENTS = ("hook_extra", *STEP_STAGES, "step_untimed")  # what the amortised K-FAC time is made of


def build_optimizer(model: torch.nn.Module, *, lr: float) -> tuple[torch.optim.Optimizer, str]:
    """The fastest LAMB here with BERT's parameter groups: DeepSpeed's FusedLamb where it builds (a slower
    baseline would flatter K-FAC's overhead; its semantics do not matter for a cost), else kaisa_ds's choice;
    AdamW when kaisa_ds.optim is absent."""
    try:
        from kaisa_ds.optim.param_groups import weight_decay_groups
        from kaisa_ds.optim.select import build_lamb
    except ImportError:
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01), "torch.optim.AdamW"
    groups = weight_decay_groups(model, weight_decay=0.01)
    if torch.cuda.is_available() and next(model.parameters()).is_cuda:
        try:
            opt, name = build_lamb(groups, lr=lr, implementation="deepspeed")
            return opt, f"LAMB ({name})"
        except RuntimeError as exc:
            logger.warning("step_cost: DeepSpeed's FusedLamb unavailable (%s); timing the auto-selected LAMB", exc)
    opt, name = build_lamb(groups, lr=lr)
    return opt, f"LAMB ({name})"


ABSOLUTE_DAMPING = 0.001  # every step-cost figure before 2026-11-27 ran at this absolute damping


def damping_of(args: argparse.Namespace) -> tuple[float | None, float | None]:
    """K-FAC's ``(damping, relative_damping)``: ``--relative-damping`` when given (the library's mode), else the
    absolute ``--damping`` (default :data:`ABSOLUTE_DAMPING`). The inverse method's cost depends on it: a small
    absolute damping sends FP16 factors past Cholesky to an eigendecomposition (``benchmarks.indefinite``)."""
    if args.relative_damping is not None:
        return None, args.relative_damping
    return (ABSOLUTE_DAMPING if args.damping is None else args.damping), None


class StepCostRun:
    """A baseline BERT with its optimizer and an identical copy with kaisa_ds's K-FAC, sharing one batch; a step is
    ``args.accumulation`` forward+backward passes (gradient accumulation), of which K-FAC's factor steps feed
    ``args.pass_fraction`` to the statistics."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        from kaisa_ds import KFACPreconditioner

        base = bert_for_pretraining(args.size, vocab=args.vocab, seq=args.seq).to(device)
        kmodel = copy.deepcopy(base)
        self.opt, self.opt_name = build_optimizer(base, lr=args.lr)
        batch = random_batch(args.batch, args.seq, args.vocab, device)
        self.interval = Interval(args.factor_every, args.inv_every)
        damping, relative_damping = damping_of(args)
        self.kfac = KFACPreconditioner(
            kmodel, factor_update_steps=args.factor_every, inv_update_steps=args.inv_every, damping=damping,
            relative_damping=relative_damping, kl_clip="auto", grafting=args.grafting, lr=args.lr,
            skip_layers=KAISA_SKIP, factor_dtype=args.factor_dtype,
            factor_sample_fraction=args.sample_fraction, compute_method=args.compute_method,
            inv_dtype=args.inv_dtype, accumulation_steps=args.accumulation, factor_pass_fraction=args.pass_fraction)
        self.runner = KaisaRunner(self.kfac, cuda=device.type == "cuda")
        self.side_by_side = SideBySide(base=base, batch=batch, runners=[self.runner], interval=self.interval,
                                       device=device, autocast=autocast_dtype(args.dtype), optimizer=self.opt,
                                       passes=args.accumulation)

    def round(self, kinds: list[str]) -> dict[str, dict[str, float]]:
        """One measurement of every kind of step, each next to a baseline forward+backward and optimizer step:
        per kind, ``baseline_fwd_bwd``, ``optimizer_step``, ``kfac_fwd_bwd``, ``precond_step`` and every stage."""
        rows = self.side_by_side.round(kinds)
        return {kind: {("kfac_fwd_bwd" if c == "fwd_bwd" else c): v for c, v in row[self.runner.name].items()}
                for kind, row in rows.items()}


def summarise(rounds: list[dict[str, dict[str, float]]], agg: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """Aggregate (median or min) every raw timing over the rounds, then derive the K-FAC cost of each kind:
    hook_extra = K-FAC forward+backward - baseline forward+backward; step_untimed = the part of
    ``precond.step()`` outside the named stages (gradient reads, finite check, factor commit)."""
    kinds = list(rounds[0])
    baseline = {c: agg([r[k][c] for r in rounds for k in kinds]) for c in ("baseline_fwd_bwd", "optimizer_step")}
    out: dict[str, Any] = {}
    for kind in kinds:
        row = {c: agg([r[kind][c] for r in rounds]) for c in rounds[0][kind] if c not in baseline}
        row["hook_extra"] = row["kfac_fwd_bwd"] - baseline["baseline_fwd_bwd"]
        row["step_untimed"] = row["precond_step"] - sum(row[s] for s in STEP_STAGES)
        row["kfac_total"] = row["hook_extra"] + row["precond_step"]
        out[kind] = row
    return baseline, out


def measure(args: argparse.Namespace, *, run: StepCostRun | None = None) -> dict[str, Any]:
    """Every figure of one configuration; ``run``: models already built with ``args`` (the caller keeps them to
    read the K-FAC structure afterwards)."""
    device = torch.device(args.device)
    info = machine()
    run = run if run is not None else StepCostRun(args, device)
    kinds = list(run.interval.counts())
    for _ in range(args.warmup):  # allocations, optimizer state, K-FAC structure and first decompositions
        run.round(kinds)
    rounds = [run.round(kinds) for _ in tqdm(range(args.repeats), desc="step_cost rounds", leave=False)]
    if run.kfac.skipped_windows:
        raise RuntimeError(f"K-FAC dropped {run.kfac.skipped_windows} window(s) for non-finite values "
                           f"({args.dtype}): the timings would not be those of real steps")
    baseline, med = summarise(rounds, median)
    best_baseline, best = summarise(rounds, min)
    step_s = baseline["baseline_fwd_bwd"] + baseline["optimizer_step"]
    res: dict[str, Any] = {
        "machine": info, "settings": {**vars(args), "out": str(args.out), "optimizer": run.opt_name,
                                           "device": str(device), "kfac_layers": len(run.kfac.layers),
                                           "kfac_factors": len(run.kfac.factors())},
        "baseline": {"fwd_bwd_s": baseline["baseline_fwd_bwd"], "optimizer_step_s": baseline["optimizer_step"],
                     "step_s": step_s},
        "step_kinds": med, "amortised": amortise(med, run.interval, components=COMPONENTS, baseline_step=step_s),
        # the same from each timing's fastest round: an estimate less exposed to other work on a shared machine
        "amortised_from_minima": amortise(best, run.interval, components=COMPONENTS,
                                          baseline_step=best_baseline["baseline_fwd_bwd"]
                                          + best_baseline["optimizer_step"]),
        "rounds": rounds, "load_average_1m_after": os.getloadavg()[0],
        "decompositions": decomposition_times(args.decomp_sizes, device, repeats=args.decomp_repeats),
    }
    res["calibration"] = calibration(res, args, device)
    return res
