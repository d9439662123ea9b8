"""The printed tables of ``benchmarks.versus_kfac_pytorch``: per step kind, amortised components, the headline
ratio, memory, agreement."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.harness.machine import machine_line
from benchmarks.harness.memory import MB
from benchmarks.harness.output import table
from benchmarks.versus_kfac_pytorch.measure import speedup
from benchmarks.versus_kfac_pytorch.settings import COMPONENTS, FACTOR_DECAY, LIBRARIES


def report(res: dict[str, Any], *, target: float = 2.0) -> str:
    """The printed tables: per step kind, amortised components, headline ratio, memory, agreement."""
    s, kinds = res["settings"], res["step_kinds"]
    cmp, best = res["comparison"], res["comparison_from_minima"]
    counts = cmp["amortised"]["kaisa_ds"]["counts"]
    lines = [f"kaisa_ds vs kfac-pytorch: BERT-{s['size']} fp32 batch {s['batch']}x{s['seq']} on {s['device']}, "
             f"inv_dtype {s.get('inv_dtype', 'fp32')} (both), kaisa_ds factor_sample_fraction "
             f"{s.get('sample_fraction', 1.0)}, "
             f"{s['kfac_layers']} K-FAC layers each; factors every {s['factor_every']}, decompositions every "
             f"{s['inv_every']} steps; medians of {s['repeats']} rounds (seconds)", machine_line(res["machine"]), ""]
    cols = [f"{lib} {k}" for k in counts for lib in LIBRARIES]
    rows = []
    for comp in ("baseline_fwd_bwd", "fwd_bwd", "hook_extra", *COMPONENTS, "precond_step", "kfac_total"):
        rows.append({"what": comp, **{f"{lib} {k}": kinds[lib][k][comp] for k in counts for lib in LIBRARIES}})
    rows.append({"what": "steps of this kind per interval", **{f"{lib} {k}": n for k, n in counts.items()
                                                               for lib in LIBRARIES}})
    lines += [table(rows, ["what", *cols]), ""]
    am = cmp["amortised"]
    per = {lib: am[lib]["components_seconds_per_step"] for lib in LIBRARIES}
    comp_rows = [{"component": c, **{lib: per[lib][c] for lib in LIBRARIES},
                  "kfac-pytorch / kaisa_ds": speedup(kfp_seconds=per["kfac-pytorch"][c],
                                                     kaisa_seconds=per["kaisa_ds"][c])}
                 for c in COMPONENTS]
    comp_rows.append({"component": "**K-FAC total, s/step**", **{lib: am[lib]["seconds_per_step"] for lib in LIBRARIES},
                      "kfac-pytorch / kaisa_ds": cmp["ratio_kfp_over_kaisa"]})
    lines += ["Amortised over the interval, s/step:", table(comp_rows, ["component", *LIBRARIES,
                                                                        "kfac-pytorch / kaisa_ds"]), ""]
    ratio = cmp["ratio_kfp_over_kaisa"]
    verdict = "met" if ratio >= target else "NOT met"
    lines.append(f"amortised K-FAC time: kaisa_ds {am['kaisa_ds']['seconds_per_step']:.4g} s/step "
                 f"({100 * cmp['overhead_of_fwd_bwd']['kaisa_ds']:.1f}% of a baseline forward+backward), kfac-pytorch "
                 f"{am['kfac-pytorch']['seconds_per_step']:.4g} s/step "
                 f"({100 * cmp['overhead_of_fwd_bwd']['kfac-pytorch']:.1f}%): **kfac-pytorch / kaisa_ds = "
                 f"{ratio:.2f}x** (target >= {target:g}: {verdict}); per kind: "
                 + ", ".join(f"{k} {v:.2f}x" for k, v in cmp["ratio_per_kind"].items()))
    lines.append(f"from each timing's fastest round: {best['ratio_kfp_over_kaisa']:.2f}x "
                 f"(kaisa_ds {best['amortised']['kaisa_ds']['seconds_per_step']:.4g}, kfac-pytorch "
                 f"{best['amortised']['kfac-pytorch']['seconds_per_step']:.4g} s/step); load average "
                 f"{res['machine']['load_average_1m']:.1f} before, {res['load_average_1m_after']:.1f} after")
    if any(v["kfac_total"] < 0 for lib in LIBRARIES for v in kinds[lib].values()) or math.isnan(ratio):
        lines.append("WARNING: a K-FAC time is negative: timing noise exceeds the effect (busy machine?); "
                     "rerun with more --repeats or --threads 1")
    agree = res["agreement"]
    mem_rows = []
    for lib in LIBRARIES:
        m = agree["memory"][lib]
        rss = next(r for r in res["peak_rss"] if r["library"] == lib)
        mem_rows.append({"library": lib, "factors MiB": m["factors"] / MB, "decompositions MiB": m["decompositions"]
                         / MB, "K-FAC MiB": (m["factors"] + m["decompositions"]) / MB,
                         "K-FAC MB (10^6)": (m["factors"] + m["decompositions"]) / 1e6,
                         "peak RSS rise MiB (own process)": rss["peak_delta"] / MB})
    lines += ["", "K-FAC memory after a decomposition step (one process):",
              table(mem_rows, ["library", "factors MiB", "decompositions MiB", "K-FAC MiB", "K-FAC MB (10^6)",
                               "peak RSS rise MiB (own process)"])]
    own = agree["memory"]["kfac-pytorch"]["own_memory_usage_total"]
    lines.append(f"(kfac-pytorch's own memory_usage() total: {own / MB:.4g} MiB; tensors of other roles: "
                 f"{agree['memory']['kfac-pytorch']['other']} bytes)")
    conv = agree["conventions"]
    lines += ["", "Same computation? One factor+decomposition step (step 0) on the same batch, "
              f"{agree['layers']} layers; max relative difference = max|x - ref| / max|ref| per layer, worst layer:",
              table([{"compared": "raw gradients (before step)", **agree["raw_gradients"]},
                     {"compared": "preconditioned gradients", **agree["preconditioned"]},
                     {"compared": "preconditioned, kfac-pytorch given kaisa_ds's factors",
                      **agree["preconditioned_with_kaisa_factors"]}],
                    ["compared", "max_rel_diff", "min_cosine", "norm_ratio", "layer"]),
              f"conventions (per factor, worst): kfac-pytorch's A statistic = kaisa_ds's to "
              f"{conv['A_statistic_max_rel_diff']:.2g}; its G statistic x batch² = kaisa_ds's to "
              f"{conv['G_statistic_times_batch_squared_max_rel_diff']:.2g} (least-squares ratio "
              f"{conv['G_scale_measured_median']:.6g}, range {conv['G_scale_min']:.6g}..{conv['G_scale_max']:.6g}; "
              f"batch² = {conv['G_scale_expected_batch_squared']:g}): kaisa_ds turns the output gradients of a "
              "mean loss back into per-sample ones, kfac-pytorch keeps them 1/batch smaller; its first running "
              f"average = {FACTOR_DECAY}·I + {1 - FACTOR_DECAY:.2g}·statistic to "
              f"{conv['identity_prior_max_rel_diff']:.2g} "
              "(kaisa_ds's first average is the statistic itself)"]
    return "\n".join(lines)
