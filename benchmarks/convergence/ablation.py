"""Where K-FAC's gain comes from: its final runs beside the same runs with identity curvature.

``python -m benchmarks.convergence ablation --regime large`` reruns the regime's final K-FAC settings (chosen.json
plus the regime's ``final_kfac``) with only the damping changed to an absolute ``--damping`` (default 1.0) that
outweighs every ``λ_A·λ_G`` of BERT's mean MLM loss by orders of magnitude (they are ≤ ~1e-2 here): the
preconditioned gradient is then the raw gradient times ``1/(1+λ_Aλ_G) ≈ 1`` per eigen-direction, so the curvature
is gone while everything else stays: the same cost (statistics, decompositions, preconditioning), the same KL clip
(whose scale ν now acts on the raw gradient), the same learning rate, warmup, LAMB after it, seeds and data. If
this identity-curvature K-FAC matches K-FAC, the gain is a step-size effect of the KL clip and the learning rate,
not curvature.

``--variant`` splits K-FAC's step into its two parts instead (``kaisa_ds.enums.Grafting``): ``kfac-size`` keeps
K-FAC's step size per layer, KL clip included, on the raw gradient's direction (K-FAC without its curvature
directions: what the identity variant meant to test, but with the size trajectory the optimizer after K-FAC sees);
``gradient`` keeps K-FAC's direction at the raw gradient's size, with no KL clip (the curvature without K-FAC's
size). Records ``ablation/<variant>_seed<s>.json``, summary ``ablation_<variant>.json``.

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
from bert_pretrain.curves import Crossing, best_point, first_crossing

IDENTITY_DAMPING = 1.0
VARIANTS = ("identity", "kfac-size", "gradient")  # what replaces the tuned K-FAC's step: see the module docstring


def variant_kfac(kfac: dict[str, Any], *, variant: str, damping: float) -> tuple[str, dict[str, Any]]:
    """The record name stem and the kfac keys of one ablation variant of the tuned K-FAC's keys."""
    if variant == "identity":  # a damping that drowns the curvature
        return f"identity_damping{damping:g}", {**kfac, "damping": damping}
    if variant == "kfac-size":
        return "kfac-size", {**kfac, "grafting": "kfac-size"}
    if variant == "gradient":
        return "gradient-size", {**kfac, "grafting": "gradient", "kl_clip": None}
    raise ValueError(f"ablation variant {variant!r}: expected one of {', '.join(VARIANTS)}")


def lamb_best(record: dict[str, Any]) -> float:
    """LAMB's lowest held-out loss over its run."""
    return min(record["curve"]["values"])


def reach(record: dict[str, Any], target: float, lamb: dict[str, Any], *, within: Crossing | None = None
          ) -> dict[str, Any]:
    """Steps and training seconds ``record`` needs to reach ``target``, and as fractions of LAMB's: its whole run, or
    ``within`` (where LAMB itself reached the target, e.g. its best: :func:`bert_pretrain.curves.best_point`)."""
    hit = first_crossing(analysis.curve_of(record), target)
    steps, seconds = (within.step, within.seconds) if within else (lamb["spec"]["steps"], lamb["train_seconds"])
    return {"target": target, "step": hit.step if hit else None, "seconds": hit.seconds if hit else None,
            "step_ratio": hit.step / steps if hit else None, "time_ratio": hit.seconds / seconds if hit else None}


def generalisation(record: dict[str, Any], lamb: dict[str, Any]) -> dict[str, Any] | None:
    """Where a held-out lead over LAMB comes from (item 2e), from both runs' dropout-off evaluations of the training
    part (``also_on_train``): the held-out lead is the training-loss lead plus the lead in the held-out-minus-training
    gap, so ``gap_share`` is the part of it that is less overfitting rather than faster optimisation. None when
    either run lacks those evaluations (or failed)."""
    if record.get("final") is None or lamb.get("final") is None:
        return None
    if "train_eval_curve" not in record or "train_eval_curve" not in lamb:
        return None
    mine, theirs = record["train_eval_curve"], lamb["train_eval_curve"]
    if not mine["values"] or not theirs["values"]:
        return None
    train, lamb_train = mine["values"][-1], theirs["values"][-1]
    gap, lamb_gap = record["final"] - train, lamb["final"] - lamb_train
    lead = lamb["final"] - record["final"]
    at = dict(zip(theirs["steps"], theirs["values"]))
    pairs = [(v, at[s]) for s, v in zip(mine["steps"], mine["values"]) if s in at]
    return {"train_final": train, "lamb_train_final": lamb_train, "train_lead": lamb_train - train,
            "gap": gap, "lamb_gap": lamb_gap, "gap_lead": lamb_gap - gap, "heldout_lead": lead,
            "gap_share": (lamb_gap - gap) / lead if lead > 0 else None,
            "train_below_share": sum(v < w for v, w in pairs) / len(pairs) if pairs else None}


def seed_rows(lamb: list[dict[str, Any]], variants: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per seed and variant: final loss and the reach of LAMB's final and best losses (and, where both runs
    evaluated the training part, :func:`generalisation`)."""
    rows = []
    for lr in sorted(lamb, key=lambda r: r["spec"]["seed"]):
        seed = lr["spec"]["seed"]
        for name, records in variants.items():
            match = [r for r in records if r["spec"]["seed"] == seed]
            if not match:
                continue
            rec = match[0]
            gen = generalisation(rec, lr)
            best = best_point(analysis.curve_of(lr))  # where LAMB reached its lowest loss, lamb_best(lr)
            rows.append({"seed": seed, "variant": name, "final": rec["final"], "lamb_final": lr["final"],
                         "lamb_best": lamb_best(lr), "to_lamb_final": reach(rec, lr["final"], lr),
                         "to_lamb_best": reach(rec, lamb_best(lr), lr, within=best),
                         "lamb_steps_to_its_best": best.step if best else None,
                         "train_seconds": rec["train_seconds"], "one_boot": one_boot(lr, rec),
                         **({"generalisation": gen} if gen is not None else {})})
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
        gen = [r["generalisation"] for r in mine if "generalisation" in r]
        if gen:
            split: dict[str, Any] = {k: analysis.spread([g[k] for g in gen])
                                     for k in ("train_lead", "gap_lead", "heldout_lead", "train_below_share")}
            lead = split["heldout_lead"]["mean"]
            # the share of the mean lead, not the mean of per-seed shares (a seed with a small lead would swing it)
            split["gap_share_of_mean_lead"] = split["gap_lead"]["mean"] / lead if lead > 0 else None
            out[name]["generalisation"] = split
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
        gen = s.get("generalisation")
        if gen:
            lines.append(f"{name}, training part evaluated with dropout off, against LAMB: held-out lead "
                         f"{gen['heldout_lead']['mean']:.3f} = training-loss lead {gen['train_lead']['mean']:.3f} "
                         f"(±{gen['train_lead']['std'] or 0:.3f}) + smaller held-out-minus-training gap "
                         f"{gen['gap_lead']['mean']:.3f} (±{gen['gap_lead']['std'] or 0:.3f}); share from the gap "
                         f"{_share(gen['gap_share_of_mean_lead'], train_lead=gen['train_lead']['mean'])}; its "
                         f"training loss below LAMB's at "
                         f"{gen['train_below_share']['mean']:.0%} of the evaluations")
    return "\n".join(lines)


def _share(value: float | None, *, train_lead: float) -> str:
    """The gap's share of a held-out lead, in words where a percentage would mislead."""
    if value is None:
        return "n/a (no held-out lead)"
    if train_lead < 0:  # e.g. 1015% of a 0.02 lead: the gap makes up for a higher training loss, and then some
        return "all of it (the training loss is higher than LAMB's; the smaller gap outweighs it)"
    return f"{value:.0%}"


def ablation(*, regime: Any, parts: Any, chosen: dict[str, Any], seeds: list[int], damping: float, vocab: Path,
             work: Path, out: Path, info: dict[str, Any], variant: str = "identity") -> dict[str, Any]:
    """Run (or reuse) LAMB, K-FAC and one ablation ``variant`` of K-FAC on the report part; write
    ``ablation.json`` (identity) or ``ablation_<variant>.json``."""
    records: dict[str, list[dict[str, Any]]] = {"lamb": [], "kfac": [], variant: []}
    jobs = [(seed, name) for seed in seeds for name in records]
    for seed, name in tqdm(jobs, desc=f"ablation {regime.name} ({variant})", unit="run"):
        spec = final_spec(regime=regime, chosen=chosen, optimizer="lamb" if name == "lamb" else "kfac", seed=seed)
        folder = "final"
        if name == variant:
            stem, kfac = variant_kfac(spec.kfac or {}, variant=variant, damping=damping)
            spec = dataclasses.replace(spec, name=f"{stem}_seed{seed}", kfac=kfac)
            folder = "ablation"
        records[name].append(run(spec, regime, parts, vocab=vocab, work=work,
                                 record=out / folder / f"{spec.name}.json", machine=info))
    rows = seed_rows(records["lamb"], {"kfac": records["kfac"], variant: records[variant]})
    result = {"regime": regime.name, "seeds": seeds, "variant": variant, "chosen": chosen["kfac"],
              **({"identity_damping": damping} if variant == "identity" else {}),
              "final_kfac": dict(regime.final_kfac), "rows": rows, "summary": summarise(rows), "machine": info}
    name = "ablation.json" if variant == "identity" else f"ablation_{variant}.json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    return result
