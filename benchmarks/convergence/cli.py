"""Command line: ``tune`` a regime on the tune part, then ``final``: chosen settings, 3 seeds, the report part.

    python -m benchmarks.convergence tune --regime small     # LAMB grid, then K-FAC grid; records every run
    python -m benchmarks.convergence tune --regime large
    python -m benchmarks.convergence tune --regime large --lamb-only  # LAMB's grid only: all `defaults` needs
    python -m benchmarks.convergence final                   # both regimes, 3 seeds each, reads the tuning choices
    python -m benchmarks.convergence final --quick           # toy scale, as the smoke test runs it
    python -m benchmarks.convergence ablation --regime large # the finals beside identity-curvature K-FAC
    python -m benchmarks.convergence defaults --regime large # K-FAC at the library's defaults and LAMB's lr
    python -m benchmarks.convergence lamb-shape --regime large  # LAMB's PolyWarmUp degree × weight decay (tune part)
    python -m benchmarks.convergence minimal --regime small  # LAMB vs K-FAC defaults without DeepSpeed or NSP
    python -m benchmarks.convergence scaling --stage plan --text T  # the batch-scaling study (scaling_cli.py)

Every run is ``bert_pretrain`` under the deepspeed launcher on 2 CPU ranks (the code users run), trained on the
training part of ``--text``. Tuning runs are evaluated on the tune part only; final runs on the report part only.
Records: ``<results>/<regime>/tune/*.json``, ``<regime>/chosen.json``, ``<regime>/final/*.json``,
``<results>/final.json`` and ``<regime>/final.png``. Recorded runs are reused, so an interrupted command continues.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.convergence import ablation, analysis, defaults, lamb_shape, minimal, scaling_cli
from benchmarks.convergence.parts import Parts, SplitError, write_parts
from benchmarks.convergence.plots import plot_regime
from benchmarks.convergence.regimes import QUICK_UNITS, REGIMES, Regime, ds_config, quick, shipped_lamb_shape
from benchmarks.convergence.runner import TUNE_SEED, final_spec, kfac_keys, run, tune_spec
from benchmarks.convergence.scale import check_scale, scale_of
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.output import table, write_json

logger = logging.getLogger("benchmarks.convergence")
REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
DEFAULT_VOCAB = DATA / "bert-vocab" / "vocab.txt"
FINAL_SEEDS = (1, 2, 3)
TARGETS_BELOW_PLATEAU = (analysis.PLATEAU_MARGIN, 1.0)  # nats below the plateau: the two fixed targets


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.convergence", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("tune", "tune one regime's LAMB and K-FAC settings on the tune part"),
                           ("final", "chosen settings × seeds on the report part; figures, plots, final.json"),
                           ("ablation", "the final K-FAC runs beside identity-curvature K-FAC (same cost, KL clip, "
                                        "lr): is the gain curvature or step size?"),
                           ("defaults", "K-FAC as '\"kfac\": {\"enabled\": true}' gives it, at LAMB's tuned lr and "
                                        "warmup, beside the tuned K-FAC and LAMB"),
                           ("lamb-shape", "LAMB's PolyWarmUp degree × weight decay at its tuned lr and warmup, on the "
                                          "tune part"),
                           ("minimal", "LAMB and K-FAC at the library's defaults in a minimal loop (no DeepSpeed, no "
                                       "NSP, its own examples), report part, beside the pipeline")):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("--text", type=Path, nargs="+",
                       help="text files or SQuAD JSON files, their articles pooled (default: each regime's texts "
                            "under ../shared/data: WikiText-2 valid; the large regime adds the SQuAD dev contexts)")
        c.add_argument("--vocab", type=Path, default=DEFAULT_VOCAB, help="BERT vocab.txt (default: %(default)s)")
        c.add_argument("--work", type=Path,
                       help="run folders, prepared data, the three parts (default: runs/convergence; with --quick "
                            "runs/convergence_quick/work)")
        c.add_argument("--results", type=Path,
                       help="JSON records and plots (default: benchmarks/results/convergence, the shipped results; "
                            "with --quick runs/convergence_quick/results: toy-scale records never go there)")
        c.add_argument("--quick", action="store_true", help="toy scale (tiny model, 4 steps, 1-run grids)")
        c.add_argument("--steps", type=int, help="override the regime's steps (tuning and final alike)")
        c.add_argument("--model-size", choices=["tiny", "mini", "base"],
                       help="override the regimes' model (default: tiny; see regimes.py for why)")
    tun = sub.choices["tune"]
    tun.add_argument("--regime", choices=sorted(REGIMES), required=True)
    tun.add_argument("--lamb-points", nargs="+", default=[], type=lamb_point, metavar="LR:WARMUP",
                     help="LAMB settings tried beside the regime's grid (e.g. beyond an edge the choice sits on); "
                          "the choice and the recorded budget cover them")
    tun.add_argument("--lamb-only", action="store_true",
                     help="tune LAMB's grid only: all that `defaults` needs (K-FAC at its defaults takes LAMB's lr and "
                          "warmup); a later run without it adds the K-FAC grid, reusing LAMB's records")
    abl = sub.choices["ablation"]
    abl.add_argument("--regime", choices=sorted(REGIMES), required=True)
    abl.add_argument("--seeds", type=int, nargs="+", help=f"default {' '.join(map(str, FINAL_SEEDS))} (quick: 1)")
    abl.add_argument("--damping", type=float, default=ablation.IDENTITY_DAMPING,
                     help="absolute damping that makes the curvature the identity (default %(default)g; BERT's "
                          "λ_A·λ_G are ≤ ~1e-2)")
    abl.add_argument("--variant", choices=ablation.VARIANTS, default="identity",
                     help="identity: the damping above; kfac-size: the raw gradient at K-FAC's step size (KL clip "
                          "included); gradient: K-FAC's direction at the raw gradient's size, no KL clip")
    dflt = sub.choices["defaults"]
    dflt.add_argument("--regime", choices=sorted(REGIMES), required=True)
    dflt.add_argument("--seeds", type=int, nargs="+",
                      help=f"default {' '.join(map(str, FINAL_SEEDS))} (quick: 1); with --part tune: {TUNE_SEED}, the "
                           "tuning seed (give more to compare candidates on several)")
    dflt.add_argument("--part", choices=["report", "tune"], default="report",
                      help="report: the final seeds (default); tune: the tuning seed and length, for choosing defaults")
    dflt.add_argument("--chosen-from", type=Path, metavar="CHOSEN_JSON",
                      help="the transfer case: LAMB's (and the tuned K-FAC's) settings from a chosen.json tuned on "
                           "another text (e.g. benchmarks/results/convergence/small/chosen.json, WikiText-2), "
                           "reported on --text's report part, into a --results folder of its own")
    dflt.add_argument("--set", dest="kfac_set", metavar="KEY=VALUE", nargs="+", default=[], type=defaults.kfac_setting,
                      help="kfac keys on top of {\"enabled\": true} (a candidate default; --part tune only)")
    dflt.add_argument("--lamb-set", dest="lamb_set", metavar="KEY=VALUE", nargs="+", default=[],
                      type=defaults.kfac_setting,
                      help="LAMB keys under K-FAC (an ablation of how K-FAC meets LAMB, e.g. max_grad_norm=0; "
                           "--part tune only)")
    shape = sub.choices["lamb-shape"]
    shape.add_argument("--regime", choices=sorted(REGIMES), required=True)
    shape.add_argument("--seeds", type=int, nargs="+", default=[TUNE_SEED],
                       help="the mean final over these seeds chooses (default: %(default)s, the tuning seed)")
    shape.add_argument("--degrees", type=float, nargs="+", default=list(lamb_shape.DEGREES),
                       help="PolyWarmUp degrees (default: %(default)s)")
    shape.add_argument("--weight-decays", type=float, nargs="+", default=list(lamb_shape.WEIGHT_DECAYS),
                       help="LAMB weight decays (default: %(default)s)")
    shape.add_argument("--nvlamb", nargs="+", choices=["false", "true"], default=["false"],
                       help="LAMB's trust ratio on the parameters without weight decay too (Apex's use_nvlamb; "
                            "default: %(default)s, as shipped)")
    shape.add_argument("--eps", type=float, nargs="+",
                       help="Adam epsilons of LAMB as an axis (default: the shipped one only, Apex's 1e-6)")
    shape.add_argument("--max-grad-norms", type=float, nargs="+",
                       help="LAMB's global-norm pre-normalisation thresholds as an axis (0: off; default: the "
                            "shipped one only)")
    loop = sub.choices["minimal"]
    loop.add_argument("--regime", choices=sorted(REGIMES), required=True)
    loop.add_argument("--seeds", type=int, nargs="+", default=[FINAL_SEEDS[0]],
                      help="final-run seeds (default: %(default)s; the pipeline's same-day records of these seeds "
                           "are read beside them)")
    loop.add_argument("--examples", choices=sorted(minimal.EXAMPLES), default="blocks",
                      help="blocks: contiguous blocks masked afresh (default); pipeline: bert_pretrain's prepared "
                           "examples (sentence pairs, fixed maskings), NSP still off")
    final = sub.choices["final"]
    final.add_argument("--regimes", nargs="+", choices=sorted(REGIMES), default=sorted(REGIMES))
    final.add_argument("--seeds", type=int, nargs="+", help=f"default {' '.join(map(str, FINAL_SEEDS))} (quick: 1)")
    scaling_cli.add_parser(sub)
    return p


def lamb_point(text: str) -> dict[str, float]:
    """``LR:WARMUP`` (``--lamb-points``) as a LAMB grid point."""
    try:
        lr, warmup = (float(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give LR:WARMUP, e.g. 0.005:0.2") from None
    return {"lr": lr, "warmup": warmup}


def shipped_results() -> Path:
    return REPO / "benchmarks" / "results" / "convergence"


def resolve_folders(args: argparse.Namespace) -> None:
    """``--work`` and ``--results`` defaults by scale; toy-scale records are refused in the shipped results (the
    README tells main-job users to pass their chosen_*_ds_config.json)."""
    if args.quick:
        args.work = args.work or REPO / "runs" / "convergence_quick" / "work"
        args.results = args.results or REPO / "runs" / "convergence_quick" / "results"
        if args.results.resolve() == shipped_results().resolve():
            raise SystemExit(f"--quick --results {args.results}: toy-scale records would replace the shipped "
                             "results; leave --results out (runs/convergence_quick/results) or give another folder")
    else:
        args.work = args.work or REPO / "runs" / "convergence"
        args.results = args.results or shipped_results()


def regime_of(name: str, args: argparse.Namespace) -> Regime:
    """The named regime, at toy scale with --quick, with --steps/--model-size applied; budgets checked."""
    regime = quick(REGIMES[name]) if args.quick else REGIMES[name]
    if args.steps:
        regime = dataclasses.replace(regime, steps=args.steps, tune_steps=args.steps)
    if args.model_size:
        regime = dataclasses.replace(regime, model_size=args.model_size,
                                     notes=regime.notes.replace("BERT-tiny", f"BERT-{args.model_size}"))
    regime.check_budget()
    return regime


def parts_of(args: argparse.Namespace, regime: Regime) -> Parts:
    """The three parts of ``--text`` or of the regime's texts (of their first 12 units at the quick scale)."""
    return write_parts(args.text or [DATA / t for t in regime.texts], args.work / "parts",
                       max_units=QUICK_UNITS if args.quick else None)


def tune(args: argparse.Namespace) -> dict[str, Any]:
    regime = regime_of(args.regime, args)
    parts = parts_of(args, regime)
    out = args.results / regime.name
    info = machine()

    def sweep(grid: list[dict[str, Any]], optimizer: str) -> list[dict[str, Any]]:
        records = []
        for s in tqdm(grid, desc=f"tune {regime.name} {optimizer}", unit="run"):
            spec = tune_spec(regime=regime, settings=s, optimizer=optimizer)
            record = run(spec, regime, parts, vocab=args.vocab, work=args.work,
                         record=out / "tune" / f"{spec.name}.json", machine=info)
            records.append({**record, "settings": s})
        return records

    if args.lamb_only:
        refuse_dropping_kfac(out / "chosen.json")
    grid = regime.lamb_grid()
    lamb = sweep(grid + [p for p in args.lamb_points if p not in grid], "lamb")
    best_lamb = analysis.choose(lamb)
    edges = analysis.grid_edges(best_lamb["settings"], [r["settings"] for r in lamb])
    for edge in edges:
        logging.warning("LAMB's choice %s: %s", best_lamb["settings"], edge)
    kfac = [] if args.lamb_only else sweep(
        regime.kfac_grid(lamb_lr=best_lamb["settings"]["lr"], warmup=best_lamb["settings"]["warmup"]), "kfac")
    best_kfac = analysis.choose(kfac) if kfac else None
    cache = Path(lamb[0]["eval_cache"])
    chosen = {"regime": regime.name, "tuned_at": scale_of(regime, quick_scale=args.quick, parts=parts,
                                                                  vocab=args.vocab),
              "lamb": best_lamb["settings"], "kfac": best_kfac["settings"] if best_kfac else None,
              "lamb_grid_edges": edges,
              "criterion": "lowest final held-out MLM loss on the tune part, tuning seed 0",
              "tune_plateau": analysis.plateau(cache, "tune"),
              "tune_frequency_model_loss": analysis.frequency_model_loss(cache, "tune",
                                                                         examples=regime.eval_examples),
              "budget": {o: {"runs": len(r), "steps_per_run": regime.tune_steps} for o, r in
                         (("lamb", lamb), ("kfac", kfac)) if r},
              "runs": [{"optimizer": r["spec"]["optimizer"], **r["settings"], "final_tune_mlm": r["final"],
                        "train_seconds": r["train_seconds"]} for r in lamb + kfac],
              "machine": info, "parts": str(parts.folder / "parts.json")}
    write_json(chosen, out / "chosen.json")
    if best_kfac is not None:
        write_json(ds_config(regime, lr=best_kfac["settings"]["lr"], warmup=best_kfac["settings"]["warmup"],
                             steps=regime.steps, kfac=kfac_keys(best_kfac["settings"])),
                   out / "chosen_kfac_ds_config.json")
    write_json(ds_config(regime, lr=best_lamb["settings"]["lr"], warmup=best_lamb["settings"]["warmup"],
                         steps=regime.steps, kfac=None), out / "chosen_lamb_ds_config.json")
    print(table(chosen["runs"], ["optimizer", "lr", "warmup", "damping", "factor_every", "inv_every",
                                 "final_tune_mlm", "train_seconds"]))
    kfac_choice = chosen["kfac"] if chosen["kfac"] is not None else "not tuned (--lamb-only)"
    print(f"chosen: LAMB {chosen['lamb']}, K-FAC {kfac_choice} → {out / 'chosen.json'}")
    return chosen


def refuse_dropping_kfac(path: Path) -> None:
    """``tune --lamb-only`` rewrites chosen.json; it must not drop a K-FAC choice a full tuning recorded there."""
    if path.is_file() and json.loads(path.read_text()).get("kfac") is not None:
        raise SystemExit(f"{path} already holds a K-FAC choice: --lamb-only would drop it; leave out --lamb-only "
                         "(every recorded run is reused)")


def load_transferred(regime: Regime, parts: Parts, args: argparse.Namespace) -> dict[str, Any]:
    """``--chosen-from``: a choice tuned on another text, refused when tuned at another scale or vocabulary, on
    this very text (no transfer), or when this run would write into the folder it was tuned in; the transfer is
    recorded in ``<results>/<regime>/transfer.json``."""
    path: Path = args.chosen_from
    if not args.text:
        raise SystemExit("--chosen-from needs --text: the transfer case reports on another text family than the "
                         f"regime's own ({', '.join(regime.texts)})")
    if not path.is_file():
        raise SystemExit(f"--chosen-from {path} does not exist (a chosen.json written by `python -m "
                         "benchmarks.convergence tune`)")
    out = args.results / regime.name
    if path.resolve().parent == out.resolve():
        raise SystemExit(f"--chosen-from {path} is this run's own results folder: give the transfer its own "
                         "--results, so the records of the text it was tuned on stay as they are")
    chosen: dict[str, Any] = json.loads(path.read_text())
    check_scale(chosen, regime, path=path, quick_scale=args.quick, parts=None, vocab=args.vocab)
    tuned_on = chosen.get("tuned_at", {}).get("sources_sha256")
    if tuned_on == parts.source_sha256:
        raise SystemExit(f"--chosen-from {path} was tuned on this very text ({', '.join(map(str, args.text))}): "
                         "that is no transfer; drop --chosen-from, or give --text another text family")
    unrecorded = "not recorded in that chosen.json (written before tuned_at existed): the regime's texts, "
    write_json({"chosen_from": str(path), "tuned_sources_sha256": tuned_on or unrecorded + ", ".join(regime.texts),
                "report_sources_sha256": parts.source_sha256, "report_texts": [str(t) for t in args.text],
                "lamb": chosen["lamb"], "kfac": chosen["kfac"]}, out / "transfer.json")
    return chosen


def load_chosen(regime: Regime, parts: Parts, args: argparse.Namespace) -> dict[str, Any]:
    """The regime's recorded tuning choice, refused when missing or tuned at another scale, text or vocabulary
    (``--chosen-from``: :func:`load_transferred`)."""
    if getattr(args, "chosen_from", None) is not None:
        return load_transferred(regime, parts, args)
    chosen_path = args.results / regime.name / "chosen.json"
    if not chosen_path.is_file():
        raise SystemExit(f"{chosen_path} is missing: run `python -m benchmarks.convergence tune --regime "
                         f"{regime.name}{' --quick' if args.quick else ''}` first")
    chosen: dict[str, Any] = json.loads(chosen_path.read_text())
    check_scale(chosen, regime, path=chosen_path, quick_scale=args.quick, parts=parts, vocab=args.vocab)
    return chosen


def final_regime(regime: Regime, parts: Parts, args: argparse.Namespace, seeds: list[int],
                 info: dict[str, Any]) -> dict[str, Any]:
    out = args.results / regime.name
    chosen = load_chosen(regime, parts, args)
    records: dict[str, list[dict[str, Any]]] = {"lamb": [], "kfac": []}
    jobs = [(seed, opt) for seed in seeds for opt in ("lamb", "kfac")]
    for seed, opt in tqdm(jobs, desc=f"final {regime.name}", unit="run"):
        spec = final_spec(regime=regime, chosen=chosen, optimizer=opt, seed=seed)
        records[opt].append(run(spec, regime, parts, vocab=args.vocab, work=args.work,
                                record=out / "final" / f"{spec.name}.json", machine=info))
    cache = Path(records["lamb"][0]["eval_cache"])
    plateau = analysis.frequency_model_loss(cache, "report", examples=regime.eval_examples)
    targets = [plateau - d for d in TARGETS_BELOW_PLATEAU]
    summary = analysis.compare(records["lamb"], records["kfac"], plateau_loss=plateau, targets=targets)
    summary["report_target_entropy"] = analysis.plateau(cache, "report")
    plot_regime(records, plateau=plateau, title=f"{regime.name} batch ({regime.notes}); seeds {seeds}",
                out=out / "final.png")
    return {"regime": dataclasses.asdict(regime), "chosen": {k: chosen[k] for k in ("lamb", "kfac")},
            "final_kfac": dict(regime.final_kfac), **summary}


def final(args: argparse.Namespace) -> dict[str, Any]:
    seeds = args.seeds or ([1] if args.quick else list(FINAL_SEEDS))
    info = machine()
    given = (["--quick"] if args.quick else []) + ["--regimes", *args.regimes, "--seeds", *map(str, seeds)]
    given += (["--text", *map(str, args.text)] if args.text else []) + ["--vocab", str(args.vocab)]
    given += (["--steps", str(args.steps)] if args.steps else []) + (
        ["--model-size", args.model_size] if args.model_size else [])
    result: dict[str, Any] = {"command": "python -m benchmarks.convergence final " + shlex.join(given),
        "machine": info, "machine_line": machine_line(info), "regimes": {}}
    for name in args.regimes:
        regime = regime_of(name, args)
        parts = parts_of(args, regime)
        result["regimes"][name] = {**final_regime(regime, parts, args, seeds, info),
                                   "parts": str(parts.folder / "parts.json")}
    write_json(result, args.results / "final.json")
    rows = []
    for name, r in result["regimes"].items():
        for opt in ("lamb", "kfac"):
            po = r["per_optimizer"][opt]
            rows.append({"regime": name, "optimizer": opt, "final (mean)": po["final"]["mean"],
                         "final (std)": po["final"]["std"], "train s (mean)": po["train_seconds"]["mean"],
                         "plateau exit step (mean)": po["plateau_exit_step"]["mean"],
                         "exits missing": po["plateau_exit_step"]["missing"]})
    print(table(rows, list(rows[0])))
    for name, r in result["regimes"].items():
        ratio = r["kfac_to_lamb_final"]["time_ratio"]
        print(f"{name}: plateau {r['plateau']:.3f}; K-FAC time to LAMB's final / LAMB's time: mean {ratio['mean']} "
              f"(std {ratio['std']}, {ratio['missing']} seed(s) never reached it); LAMB leaves the plateau well "
              f"before the end: {r['lamb_leaves_plateau_well_before_end']}; target (≤ 0.7) met: {r['target_met']}")
    print(f"wrote {args.results / 'final.json'} and {args.results}/<regime>/final.png")
    return result


def run_ablation(args: argparse.Namespace) -> dict[str, Any]:
    """``ablation``: the regime's final K-FAC beside identity-curvature K-FAC, reusing the final runs' records."""
    written = "ablation.json" if args.variant == "identity" else f"ablation_{args.variant}.json"
    return _variants(args, lambda **kw: ablation.ablation(damping=args.damping, variant=args.variant, **kw), written)


def run_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """``defaults``: K-FAC at the library's defaults and LAMB's lr beside the tuned K-FAC, reusing the finals (or,
    with ``--part tune``, a candidate default beside LAMB's tuning run)."""
    extra, lamb_set = dict(args.kfac_set), dict(args.lamb_set) or None
    if (extra or lamb_set) and args.part != "tune":
        raise SystemExit("--set/--lamb-set: candidate defaults and ablations are tried on the tune part only (add "
                         "--part tune); the report part measures what the library ships")
    if args.chosen_from is not None and args.part == "tune":
        raise SystemExit("--chosen-from: the transfer case is reported on the report part; leave out --part tune")
    if args.part == "tune" and args.seeds is None:
        args.seeds = [TUNE_SEED]  # the tuning seed unless more are asked for
    return _variants(args, lambda **kw: defaults.defaults(part=args.part, extra=extra, lamb_shape=lamb_set, **kw),
                     "defaults_tune.json" if args.part == "tune" else "defaults.json")


def extra_lamb_axes(args: argparse.Namespace) -> dict[str, tuple[Any, ...]]:
    """The optional lamb-shape axes given on the command line (NVLAMB only when it is more than the shipped off)."""
    axes: dict[str, tuple[Any, ...]] = {}
    if args.nvlamb != ["false"]:
        axes["use_nvlamb"] = tuple(v == "true" for v in args.nvlamb)
    for key, values in (("max_grad_norm", args.max_grad_norms), ("eps", args.eps)):
        if values:
            axes[key] = tuple(values)
    return axes


def run_lamb_shape(args: argparse.Namespace) -> dict[str, Any]:
    """``lamb-shape``: LAMB's schedule degree × weight decay at its tuned lr and warmup, on the tune part."""
    regime = regime_of(args.regime, args)
    parts = parts_of(args, regime)
    out = args.results / regime.name
    result = lamb_shape.lamb_shape(regime=regime, parts=parts, chosen=load_chosen(regime, parts, args),
                                   seeds=args.seeds, vocab=args.vocab, work=args.work, out=out, info=machine(),
                                   degrees=tuple(args.degrees), weight_decays=tuple(args.weight_decays),
                                   extra_axes=extra_lamb_axes(args))
    print(table(result["rows"], [*shipped_lamb_shape(), "finals", "best", "mean_final"]))
    print(f"chosen: {result['chosen']} (shipped {result['shipped']}; changes LAMB: {result['changes_lamb']}); "
          f"wrote {' and '.join(str(out / name) for name in result['written'])}")
    return result


def run_minimal(args: argparse.Namespace) -> dict[str, Any]:
    """``minimal``: LAMB and K-FAC at the library's defaults through the minimal loop, beside the pipeline."""
    regime = regime_of(args.regime, args)
    parts = parts_of(args, regime)
    out = args.results / regime.name
    result = minimal.minimal(regime=regime, parts=parts, chosen=load_chosen(regime, parts, args), seeds=args.seeds,
                             vocab=args.vocab, work=args.work, out=out, info=machine(), examples=args.examples)
    print("minimal loop:")
    print(ablation.report(result))
    if result["pipeline_same_day_rows"]:
        print("pipeline (same-day records of the same seeds):")
        rows = result["pipeline_same_day_rows"]
        print(ablation.report({"rows": rows, "summary": ablation.summarise(rows)}))
    steps = {f"seed {r['seed']}": r["to_lamb_final"]["step_ratio"] for r in result["rows"]}
    print(f"minimal loop, steps to LAMB's final as a fraction of LAMB's: {steps}")
    stem = minimal.STEMS[args.examples]
    print(f"passes over the training text: {result['passes_over_text']}; wrote {out / stem}.json and "
          f"{out / stem}.png")
    return result


def _variants(args: argparse.Namespace, study: Any, written: str) -> dict[str, Any]:
    """Run a per-seed study of K-FAC variants against the final LAMB runs, then print its rows and summary."""
    regime = regime_of(args.regime, args)
    parts = parts_of(args, regime)
    out = args.results / regime.name
    chosen = load_chosen(regime, parts, args)
    seeds = args.seeds or ([1] if args.quick else list(FINAL_SEEDS))
    result: dict[str, Any] = study(regime=regime, parts=parts, chosen=chosen, seeds=seeds, vocab=args.vocab,
                                   work=args.work, out=out, info=machine())
    print(ablation.report(result))
    print(f"wrote {out / written}")
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "scaling":  # its own folders (runs/scaling, results/convergence/scaling)
        return scaling_cli.main(args)
    resolve_folders(args)
    try:
        return {"tune": tune, "final": final, "ablation": run_ablation, "defaults": run_defaults,
                "lamb-shape": run_lamb_shape, "minimal": run_minimal}[args.command](args)
    except SplitError as exc:
        raise SystemExit(f"python -m benchmarks.convergence: {exc}") from exc
