"""K-FAC's cost per step on CPU ranks under each KAISA distribution, beside LAMB, in the pipeline itself.

``bert_pretrain`` phase 1 on ``--ranks`` gloo ranks (the deepspeed launcher), once with LAMB and once with K-FAC
under each strategy, round after round (so a slow spell of the machine hits every variant of a round). Per
variant: seconds per training step, the mean over the steps after ``--skip`` warm-up steps (K-FAC's factor and
decomposition steps included: its amortised cost; the median, also recorded, is a plain step's), evaluation and
saving not counted; K-FAC's stage times per step; each round's K-FAC / LAMB ratio of those means. Every strategy
yields the same preconditioned gradients, so their losses must agree: the report checks that too.

COMM-OPT runs every layer's four preconditioning matmuls on every rank; MEM-OPT gives each layer to one rank and
broadcasts its result, which on CPU ranks is a local copy: the default ``grad_worker_fraction="auto"`` is MEM-OPT
there because of this benchmark.

    python -m benchmarks.strategy_cost                    # the main job's phase 1 (BERT-tiny, 2 x 16 x 64): ~8 min
    python -m benchmarks.strategy_cost --config ds_configs/bert_tiny_phase1_kfac.json --model-size mini \\
        --max-seq-length 32 --max-predictions 5 --steps 40 --skip 10 --rounds 1
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.output import publish, table
from kaisa_ds.enums import DistributedStrategy
from kaisa_ds.report.metrics_log import read_rows

REPO = Path(__file__).resolve().parents[1]
MISSION_CONFIG = REPO / "ds_configs" / "bert_tiny_mission_phase1_kfac.json"
STRATEGIES = (DistributedStrategy.COMM_OPT.value, DistributedStrategy.MEM_OPT.value)  # the config values timed
LAMB = "lamb"


def variant_config(base: dict[str, Any], strategy: str | None) -> dict[str, Any]:
    """``base`` without its ``kfac`` section (LAMB), or with ``grad_worker_fraction`` set to ``strategy``."""
    config = copy.deepcopy(base)
    section = config.pop("kfac", None)
    if strategy is None:
        return config
    if not isinstance(section, dict) or not section.get("enabled"):
        raise ValueError("strategy_cost: --config needs an enabled kfac section (its K-FAC settings are timed)")
    config["kfac"] = {**section, "grad_worker_fraction": strategy}
    return config


def run_figures(rows: list[dict[str, Any]], *, skip: int, batch: int) -> dict[str, Any]:
    """Seconds per step (median and mean after ``skip`` steps; a row logs ``batch`` / its step's seconds),
    K-FAC's mean stage milliseconds, the final loss."""
    timed = [r for r in rows if "seq_per_s" in r][skip:]
    if not timed:
        raise ValueError(f"strategy_cost: no training step after the first {skip}; raise --steps or lower --skip")
    seconds = [batch / float(r["seq_per_s"]) for r in timed]
    stages: dict[str, float] = {}
    for r in timed:
        for stage, ms in r.get("kfac_ms", {}).items():
            stages[stage] = stages.get(stage, 0.0) + ms / len(timed)
    return {"step_s_median": statistics.median(seconds), "step_s_mean": statistics.fmean(seconds),
            "steps_timed": len(timed), "final_loss": float(timed[-1]["loss"]), "kfac_ms": stages}


def summarise(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per variant: the median over rounds of the mean seconds per step, and each round's ratio to that round's LAMB;
    whether the strategies' losses agree (they train the same model with the same gradients)."""
    out: dict[str, Any] = {}
    for name in rounds[0]:
        per_round = [r[name]["step_s_mean"] for r in rounds]
        ratios = [r[name]["step_s_mean"] / r[LAMB]["step_s_mean"] for r in rounds]
        stages = {s: statistics.fmean(r[name]["kfac_ms"].get(s, 0.0) for r in rounds)
                  for s in rounds[0][name]["kfac_ms"]}
        out[name] = {"step_s": statistics.median(per_round), "ratio_to_lamb": statistics.fmean(ratios),
                     "ratio_spread": statistics.stdev(ratios) if len(ratios) > 1 else 0.0, "ratios": ratios,
                     "kfac_ms": stages, "kfac_ms_total": sum(stages.values())}
    losses = [[r[s]["final_loss"] for s in STRATEGIES if s in r] for r in rounds]
    out["strategies_agree"] = all(max(ls) - min(ls) <= 1e-4 * max(1.0, abs(ls[0])) for ls in losses if ls)
    return out


def report(res: dict[str, Any]) -> str:
    s, settings = res["summary"], res["settings"]
    rows = [{"variant": name, "s/step (mean)": s[name]["step_s"], "x LAMB (mean of rounds)": s[name]["ratio_to_lamb"],
             "spread": s[name]["ratio_spread"], "K-FAC ms/step": s[name]["kfac_ms_total"] or None,
             **{f"{k} ms": v for k, v in s[name]["kfac_ms"].items()
                if k in ("factor_capture", "preconditioning", "gradient_broadcast")}}
            for name in (LAMB, *STRATEGIES)]
    columns = list(dict.fromkeys(c for r in rows for c in r))
    agree = "agree" if s["strategies_agree"] else "DIFFER (a distribution bug: every strategy must give the same step)"
    return "\n".join([
        f"bert_pretrain phase 1, {settings['config']}, BERT-{settings['model_size']}, {settings['ranks']} CPU ranks, "
        f"{settings['steps']} steps per run (first {settings['skip']} not timed), {settings['rounds']} round(s)",
        machine_line(res["machine"]), "", table(rows, columns), "",
        f"final losses of the strategies: {agree}"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("strategy_cost", __doc__)
    p.add_argument("--config", type=Path, default=MISSION_CONFIG, help="phase-1 DeepSpeed JSON with a kfac section "
                   "(default: the main job's)")
    p.add_argument("--model-size", default="tiny")
    p.add_argument("--max-seq-length", type=int, default=64)
    p.add_argument("--max-predictions", type=int, default=10)
    p.add_argument("--data", type=Path, help="training text (default: the built-in corpus)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--skip", type=int, default=20, help="first steps not timed")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--work", type=Path, default=REPO / "runs" / "strategy_cost", help="scratch folder")
    args = p.parse_args(argv)
    if args.steps <= args.skip or args.rounds < 1 or args.ranks < 2:
        p.error("--steps must exceed --skip, --rounds be >= 1 and --ranks >= 2 (strategies differ across ranks)")
    return run(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from mission.jobs import launch

    base = json.loads(args.config.read_text())
    info = machine()
    common = ["--phase", "1", "--max-steps", str(args.steps), "--eval-every", str(args.steps), "--model-size",
              args.model_size, "--seed", "0", "--max-seq-length", str(args.max_seq_length), "--max-predictions",
              str(args.max_predictions), "--data-cache", str(args.work / "data"), "--save-every", "0",
              "--keep-checkpoints", "1", "--overwrite", *(["--data", str(args.data)] if args.data else [])]
    rounds: list[dict[str, dict[str, Any]]] = []
    for i in range(args.rounds):
        figures: dict[str, dict[str, Any]] = {}
        for name, strategy in ((LAMB, None), *((s, s) for s in STRATEGIES)):
            folder = args.work / name
            config = args.work / f"{name}.json"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(json.dumps(variant_config(base, strategy), indent=1))
            launch("bert_pretrain", [*common, "--config", str(config), "--output", str(folder)], ranks=args.ranks,
                   log=args.work / f"{name}_round{i}.log")
            batch = json.loads((folder / "summary.json").read_text())["global_batch"]
            figures[name] = run_figures(read_rows(folder / "metrics.jsonl"), skip=args.skip, batch=batch)
        rounds.append(figures)
    settings = {**vars(args), "config": str(args.config.relative_to(REPO) if args.config.is_relative_to(REPO)
                                            else args.config)}
    res = {"machine": info, "settings": settings, "rounds": rounds, "summary": summarise(rounds)}
    publish(res, report(res), args.out)
    return res


if __name__ == "__main__":
    main()
