"""The printed tables of ``benchmarks.step_cost``: per step kind, the amortised breakdown, the decompositions."""

from __future__ import annotations

from typing import Any

from benchmarks.harness.machine import machine_line
from benchmarks.harness.output import table
from benchmarks.step_cost.measure import STEP_STAGES
from kaisa_ds.enums import ComputeMethod


def report(res: dict[str, Any]) -> str:
    """The printed tables: per step kind, the amortised breakdown, the decompositions."""
    s = res["settings"]
    kinds = res["step_kinds"]
    counts = res["amortised"]["counts"]
    method = ComputeMethod(s.get("compute_method", ComputeMethod.EIGEN)).value
    lines = [f"BERT-{s['size']} {s['dtype']} batch {s['batch']}x{s['seq']} on {s['device']}, "
             f"optimizer {s['optimizer']}, "
             f"{s['kfac_layers']} K-FAC layers; factors every {s['factor_every']}, decompositions every "
             f"{s['inv_every']} steps, {method} method, "
             f"inv_dtype {s.get('inv_dtype', 'fp32')}, factor_sample_fraction {s.get('sample_fraction', 1.0)}; "
             f"medians of {s['repeats']} rounds", machine_line(res["machine"]), ""]
    rows = [{"what": "baseline forward+backward", **{k: res["baseline"]["fwd_bwd_s"] for k in kinds}},
            {"what": "optimizer step", **{k: res["baseline"]["optimizer_step_s"] for k in kinds}}]
    for comp in ("kfac_fwd_bwd", "hook_extra", "factor_capture", *STEP_STAGES, "step_untimed", "precond_step",
                 "kfac_total"):
        rows.append({"what": comp, **{k: v[comp] for k, v in kinds.items()}})
    rows.append({"what": "steps of this kind per interval", **counts})
    lines += [table(rows, ["what", *kinds]), ""]
    am = res["amortised"]
    per = am["components_seconds_per_step"]
    total = am["seconds_per_step"]
    lines.append(table([{"component": c, "s/step": v, "share": f"{100 * v / total:.1f}%" if total else ""}
                        for c, v in sorted(per.items(), key=lambda kv: -kv[1])], ["component", "s/step", "share"]))
    lines.append(f"\namortised K-FAC time {total:.4g} s/step over a {s['inv_every']}-step interval = "
                 f"{100 * am['overhead']:.1f}% of a baseline step ({res['baseline']['step_s']:.4g} s: forward+backward "
                 f"+ {s['optimizer']} step)")
    if any(v["kfac_total"] < 0 for v in kinds.values()):
        lines.append("WARNING: a step kind costs less with K-FAC than without: timing noise exceeds the effect here "
                     "(other work on this machine?); rerun with more --repeats, or --threads 1 on a busy machine")
    lines.append(f"from K-FAC's own timed work (hook callbacks + precond.step(), no forward+backward difference): "
                 f"{am['stage_seconds_per_step']:.4g} s/step = {100 * am['stage_overhead']:.1f}%")
    best = res["amortised_from_minima"]
    lines.append(f"from each timing's fastest round instead of its median: {best['seconds_per_step']:.4g} s/step = "
                 f"{100 * best['overhead']:.1f}% (load average {res['machine']['load_average_1m']:.1f} before, "
                 f"{res['load_average_1m_after']:.1f} after)\n")
    if res["decompositions"]:
        lines.append(table(res["decompositions"], ["size", "repeats", "eigh_fp32_s", "inverse_fp32_s"]))
    return "\n".join(lines)
