"""Where K-FAC's gain comes from: its final runs beside the same runs with identity curvature.

``python -m benchmarks.convergence ablation --regime large`` reruns the regime's final K-FAC settings (chosen.json
plus the regime's ``final_kfac``) with only the damping changed to an absolute ``--damping`` (default 1.0) that
outweighs every ``λ_A·λ_G`` of BERT's mean MLM loss by orders of magnitude (they are ≤ ~1e-2 here): the
preconditioned gradient is then the raw gradient times ``1/(1+λ_Aλ_G) ≈ 1`` per eigen-direction, so the curvature
is gone while everything else stays: the same cost (statistics, decompositions, preconditioning), the same KL clip
(whose scale ν now acts on the raw gradient), the same learning rate, warmup, LAMB after it, seeds and data. If
this identity-curvature K-FAC matches K-FAC, the gain is a step-size effect of the KL clip and the learning rate,
not curvature.

Figures, per seed, on the report part only: each variant's final loss, its steps and training seconds to LAMB's
*final* and to LAMB's *best* held-out loss (a LAMB whose loss rises late would otherwise hand out a win), as
fractions of LAMB's run. Records: ``<results>/<regime>/ablation/*.json`` and ``ablation.json``; runs are reused.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.convergence import analysis
from benchmarks.convergence.runner import final_spec, run
from benchmarks.harness.output import table
from bert_pretrain.curves import first_crossing

IDENTITY_DAMPING = 1.0


def lamb_best(record: dict[str, Any]) -> float:
    """LAMB's lowest held-out loss over its run."""
    return min(record["curve"]["values"])


def reach(record: dict[str, Any], target: float, lamb: dict[str, Any]) -> dict[str, Any]:
    """Steps and training seconds ``record`` needs to reach ``target``, and as fractions of LAMB's whole run."""
    hit = first_crossing(analysis.curve_of(record), target)
    return {"target": target, "step": hit.step if hit else None, "seconds": hit.seconds if hit else None,
            "step_ratio": hit.step / lamb["spec"]["steps"] if hit else None,
            "time_ratio": hit.seconds / lamb["train_seconds"] if hit else None}


def seed_rows(lamb: list[dict[str, Any]], variants: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per seed and variant: final loss and the reach of LAMB's final and best losses."""
    rows = []
    for lr in sorted(lamb, key=lambda r: r["spec"]["seed"]):
        seed = lr["spec"]["seed"]
        for name, records in variants.items():
            match = [r for r in records if r["spec"]["seed"] == seed]
            if not match:
                continue
            rec = match[0]
            rows.append({"seed": seed, "variant": name, "final": rec["final"], "lamb_final": lr["final"],
                         "lamb_best": lamb_best(lr), "to_lamb_final": reach(rec, lr["final"], lr),
                         "to_lamb_best": reach(rec, lamb_best(lr), lr),
                         "lamb_steps_to_its_best": reach(lr, lamb_best(lr), lr)["step"],
                         "train_seconds": rec["train_seconds"], "one_boot": one_boot(lr, rec)})
    return rows


def boot_id(record: dict[str, Any]) -> str | None:
    """The machine boot a run record names (None for older records, made before records kept it)."""
    return (record.get("machine") or {}).get("boot_id")


def one_boot(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two records were trained on one boot of one machine: only then is a ratio of their seconds a ratio
    of the optimizers (this machine's speed changed by up to 33% between boots)."""
    return boot_id(a) is not None and boot_id(a) == boot_id(b)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread of each variant's ratios over the seeds (None where a seed never reached the target)."""
    out: dict[str, Any] = {}
    for name in sorted({r["variant"] for r in rows}):
        mine = [r for r in rows if r["variant"] == name]
        out[name] = {"final": analysis.spread([r["final"] for r in mine]),
                     "train_seconds": analysis.spread([r["train_seconds"] for r in mine])}
        for target in ("to_lamb_final", "to_lamb_best"):
            out[name][target] = {k: analysis.spread([r[target][k] for r in mine]) for k in ("step_ratio",
                                                                                            "time_ratio")}
    return out


def report(result: dict[str, Any]) -> str:
    """A study's per-seed rows and each variant's summary (ratios to LAMB's final and best), as printed."""
    rows = [{"seed": r["seed"], "variant": r["variant"], "final": r["final"], "LAMB final": r["lamb_final"],
             "LAMB best": r["lamb_best"], "time to LAMB final": r["to_lamb_final"]["time_ratio"],
             "time to LAMB best": r["to_lamb_best"]["time_ratio"], "one boot": r.get("one_boot")}
            for r in result["rows"]]
    lines = [table(rows, list(rows[0]))]
    if not all(r.get("one_boot") for r in result["rows"]):
        lines.append("rows not trained on one boot beside their LAMB run: their time ratios measure the machine too; "
                     "`python -m benchmarks.convergence.same_day` pairs them on one boot (steps are comparable)")
    for name, s in result["summary"].items():
        final, best = s["to_lamb_final"]["time_ratio"], s["to_lamb_best"]["time_ratio"]
        lines.append(f"{name}: final {s['final']['mean']} (±{s['final']['std']}); time to LAMB's final "
                     f"{final['mean']} (±{final['std']}, {final['missing']} never), to LAMB's best {best['mean']} "
                     f"(±{best['std']}, {best['missing']} never)")
    return "\n".join(lines)


def ablation(*, regime: Any, parts: Any, chosen: dict[str, Any], seeds: list[int], damping: float, vocab: Path,
             work: Path, out: Path, info: dict[str, Any]) -> dict[str, Any]:
    """Run (or reuse) LAMB, K-FAC and identity-curvature K-FAC on the report part; write ``ablation.json``."""
    records: dict[str, list[dict[str, Any]]] = {"lamb": [], "kfac": [], "identity": []}
    jobs = [(seed, name) for seed in seeds for name in records]
    for seed, name in tqdm(jobs, desc=f"ablation {regime.name}", unit="run"):
        spec = final_spec(regime=regime, chosen=chosen, optimizer="lamb" if name == "lamb" else "kfac", seed=seed)
        folder = "final"
        if name == "identity":  # the tuned K-FAC with a damping that drowns the curvature
            spec = dataclasses.replace(spec, name=f"identity_damping{damping:g}_seed{seed}",
                                       kfac={**(spec.kfac or {}), "damping": damping})
            folder = "ablation"
        records[name].append(run(spec, regime, parts, vocab=vocab, work=work,
                                 record=out / folder / f"{spec.name}.json", machine=info))
    rows = seed_rows(records["lamb"], {"kfac": records["kfac"], "identity": records["identity"]})
    result = {"regime": regime.name, "seeds": seeds, "identity_damping": damping, "chosen": chosen["kfac"],
              "final_kfac": dict(regime.final_kfac), "rows": rows, "summary": summarise(rows), "machine": info}
    (out / "ablation.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
