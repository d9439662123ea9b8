"""Part ``diagnose``: where step_cost's K-FAC time goes, when the first GPU figures miss the target.

Four findings a short device call can give (the first H100 call measured K-FAC at ~2× a bf16 LAMB step):
- ``alignment``: batched BF16 matmuls of BERT-Large's preconditioning shapes with a bias-augmented size (1025, 4097)
  against the same padded to a multiple of 8 (what ``kaisa_ds.precondition.grouped`` now does on a GPU);
- ``fp16_exact``: which statistics are non-finite when the exact (unsampled) FP16 run drops its windows: every
  Gram matrix the factor step computes is checked (input and output), and every K-FAC gradient;
- ``profile``: torch.profiler's top operators (self device time) of one plain and one factor K-FAC step;
- ``effectiveness``: per layer, the cosine between the preconditioned and the raw gradient at a decomposition step,
  with FP32 and BF16 decompositions and BF16 without the aligned padding: the second H100 session's step_cost runs
  warned that it was negative in 6-13 of 144 BERT-Large layers (BF16 decompositions, damping 1e-3, random tokens),
  which BERT-mini and BERT-base on the CPU do not show (bf16 within 0.6-0.7% of fp32, cosine 1.0). A fourth case
  turns off cuBLAS's reduced-precision reductions in BF16 GEMMs (PyTorch allows them by default; the CPU's BF16
  GEMMs always accumulate in FP32): a positive-definite preconditioner cannot point away in exact arithmetic, but
  its low-curvature directions multiply the rounding error of the rotated gradient by up to ``1/γ``, and split-K
  partial sums kept in BF16 would make that error large enough to flip the sign.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu.bert_cost import free, step_args
from benchmarks.gpu.context import Context
from benchmarks.harness.machine import machine
from benchmarks.harness.timing import median, timed
from benchmarks.step_cost.measure import StepCostRun
from kaisa_ds.enums import ComputeMethod

ROWS = 25  # operators kept per profiled step


def _bmm_seconds(a: torch.Tensor, b: torch.Tensor, cuda: bool, repeats: int = 5) -> float:
    torch.bmm(a, b)
    return median([timed(lambda: torch.bmm(a, b), cuda=cuda) for _ in range(repeats)])


def alignment(ctx: Context) -> list[dict[str, Any]]:
    """Seconds of ``(L, m, k) @ (L, k, n)`` BF16 products, unaligned and padded to a multiple of 8."""
    layers, hidden, inter = (2, 16, 32) if ctx.smoke else (24, 1024, 4096)
    cases = [("G-side, intermediate", (layers, inter, inter), hidden + 1),
             ("A-side, intermediate", (layers, inter, hidden + 1), hidden + 1),
             ("A-side, output", (layers, hidden, inter + 1), inter + 1)]
    dtype = torch.float32 if ctx.smoke else torch.bfloat16
    rows = []
    for label, (n_layers, m, k), n in cases:
        row: dict[str, Any] = {"case": label, "layers": n_layers}
        for tag, (kk, nn) in {"unaligned": (k, n), "padded": (k + (-k % 8), n + (-n % 8))}.items():
            a = torch.randn(n_layers, m, kk, device=ctx.device, dtype=dtype)
            b = torch.randn(n_layers, kk, nn, device=ctx.device, dtype=dtype)
            row[f"{tag}_shape"] = [n_layers, m, kk, nn]
            row[f"{tag}_s"] = _bmm_seconds(a, b, ctx.device.type == "cuda")
            del a, b
        row["speedup"] = row["unaligned_s"] / row["padded_s"]
        rows.append(row)
    return rows


def fp16_exact(ctx: Context, batch: int) -> dict[str, Any]:
    """One exact FP16 factor step with every Gram matrix and K-FAC gradient checked for non-finite values."""
    from kaisa_ds.factors import statistics

    dtype = "bf16" if ctx.smoke else "fp16"
    run = StepCostRun(step_args(ctx, dtype=dtype, batch=batch, sample_fraction=1.0), ctx.device)
    grams: list[dict[str, Any]] = []
    original: Callable[..., torch.Tensor] = statistics.gram

    def checked(x: torch.Tensor, **kwargs: Any) -> torch.Tensor:  # gram's keywords (blocks, out) pass through
        out = original(x, **kwargs)
        grams.append({"shape": list(x.shape), "dtype": str(x.dtype), "input_finite": bool(torch.isfinite(x).all()),
                      "input_amax": float(x.float().abs().amax()), "output_finite": bool(torch.isfinite(out).all()),
                      "output_amax": float(out.abs().amax())})
        return out

    statistics.gram = checked  # type: ignore[assignment]
    try:
        run.round(["factor"])
    finally:
        statistics.gram = original  # type: ignore[assignment]
    bad_grads = [n for n, p in run.kfac.model.named_parameters() if p.grad is not None
                 and not bool(torch.isfinite(p.grad).all())]
    out = {"dtype": dtype, "batch": batch, "skipped_windows": run.kfac.skipped_windows, "grams": len(grams),
           "nonfinite_inputs": [g for g in grams if not g["input_finite"]][:10],
           "nonfinite_outputs": [g for g in grams if g["input_finite"] and not g["output_finite"]][:10],
           "largest_outputs": sorted(grams, key=lambda g: -g["output_amax"])[:5],
           "nonfinite_grads": bad_grads[:20]}
    del run
    free()
    return out


def profile(ctx: Context, batch: int) -> dict[str, Any]:
    """Top operators by self device time (self CPU time on a CPU) of one plain and one factor K-FAC step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run = StepCostRun(step_args(ctx, dtype="bf16", batch=batch, sample_fraction=0.25), ctx.device)
    kinds = ["decomposition", "factor", "plain"]
    run.round(kinds)  # structure, first decompositions, allocations
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    sort = "self_cuda_time_total" if ctx.device.type == "cuda" else "self_cpu_time_total"
    out: dict[str, Any] = {}
    for kind in ("plain", "factor"):
        with torch_profile(activities=activities) as prof:
            run.round([kind])
        out[kind] = prof.key_averages().table(sort_by=sort, row_limit=ROWS, max_name_column_width=60)
    del run
    free()
    return out


# (compute method, inv_dtype, grouped align (None: its own), cuBLAS's reduced-precision BF16 reductions allowed).
# The eigen cases came first (2026-11-27, call 6: no layer pointed away in any of them); the inverse cases test the
# next suspect: step_cost warned only while its inverse-method configurations ran, whose damped inverses are
# computed in FP32 and stored in inv_dtype, where rounding need not keep them positive definite.
EFFECTIVENESS_CASES = (("eigen", "bf16", None, True), ("eigen", "bf16", None, False), ("eigen", "fp32", None, True),
                       ("eigen", "bf16", 1, True), ("inverse", "bf16", None, True), ("inverse", "fp32", None, True))
PIECES = ("fp16_exact", "effectiveness", "alignment", "profile")


def case_name(method: str, inv_dtype: str, align: int | None, reduced: bool) -> str:
    """The key of one :data:`EFFECTIVENESS_CASES` row in the part's JSON (eigen cases unprefixed, as first run)."""
    prefix = "" if method == "eigen" else f"{method}_"
    return (f"{prefix}{inv_dtype}_align{'-default' if align is None else align}"
            f"{'' if reduced else '_full-reduction'}")


def case_names() -> list[str]:
    """Every effectiveness case's name, in the order they run."""
    return [case_name(*case) for case in EFFECTIVENESS_CASES]


def effectiveness(ctx: Context, batch: int, report: dict[str, Any]) -> dict[str, Any]:
    """Per case of :data:`EFFECTIVENESS_CASES`: every layer's (damping share, cosine to the raw gradient) at the
    second decomposition step, and the layers whose cosine is negative. Each case is written into
    ``report["effectiveness"]`` as it ends, so a call cut short keeps the cases it finished."""
    from kaisa_ds.precondition import effectiveness as eff

    out: dict[str, Any] = report.setdefault("effectiveness", {})
    original = eff.measure
    allowed = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    chosen = ctx.args.cases
    for method, inv_dtype, align, reduced in EFFECTIVENESS_CASES:
        name = case_name(method, inv_dtype, align, reduced)
        if chosen and name not in chosen:
            continue
        if ctx.seconds_left() < 30:
            out[name] = {"skipped": "call's time budget"}
            continue
        figures: dict[str, Any] = {}

        def recording(*a: Any, into: dict[str, Any] = figures, **k: Any) -> Any:
            got = original(*a, **k)
            into.clear()
            into.update(got)
            return got

        eff.measure = recording  # type: ignore[assignment]
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
        try:  # the setting is restored even when building the run fails (e.g. out of memory)
            args = step_args(ctx, dtype="bf16", batch=batch, sample_fraction=0.25, method=ComputeMethod(method))
            args.inv_dtype = inv_dtype
            run = StepCostRun(args, ctx.device)
            if align is not None:
                run.kfac.grouped.align = align
            for _ in range(2):
                run.round(["decomposition"])
        finally:
            eff.measure = original  # type: ignore[assignment]
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = allowed
        measured = {n: f for n, f in figures.items() if f is not None}
        cosines = sorted(cos for _, cos in measured.values())
        out[name] = {
            "method": method, "inv_dtype": inv_dtype, "bf16_reduced_precision_reduction": reduced,
            "layers": len(measured), "negative": sorted(n for n, (_, cos) in measured.items() if cos < 0),
            "min_cosine": cosines[0] if cosines else None,
            "median_cosine": cosines[len(cosines) // 2] if cosines else None,
            "median_damping_share": sorted(sh for sh, _ in measured.values())[len(measured) // 2] if measured else None,
            "per_layer": {n: {"damping_share": sh, "cosine": cos} for n, (sh, cos) in measured.items()}}
        del run
        free()
        ctx.write("diagnose", report)
    return out


def run(ctx: Context) -> dict[str, Any]:
    batch = 2 if ctx.smoke else ctx.args.batches[0]
    out: dict[str, Any] = {"machine": machine(), "ok": False}
    # the open questions first (fp16 windows, effectiveness); alignment and profile were measured on 2026-11-26
    pieces = [name for name in PIECES if name in (ctx.args.pieces or PIECES)]
    runs: dict[str, Callable[[], Any]] = {"fp16_exact": lambda: fp16_exact(ctx, batch),
                                          "effectiveness": lambda: effectiveness(ctx, batch, out),
                                          "alignment": lambda: alignment(ctx), "profile": lambda: profile(ctx, batch)}
    for name in pieces:
        if ctx.seconds_left() < 30:
            out[name] = {"skipped": "call's time budget"}
            continue
        out[name] = runs[name]()
        ctx.write("diagnose", out)
    out["ok"] = all("skipped" not in out[k] for k in pieces)
    ctx.write("diagnose", out)
    for name, case in out.get("effectiveness", {}).items():
        print(f"effectiveness {name}: {case.get('skipped') or ''}{len(case.get('negative', []))} of "
              f"{case.get('layers')} layers point away, min cosine {case.get('min_cosine')}")
    return out
