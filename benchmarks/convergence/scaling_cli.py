"""``python -m benchmarks.convergence scaling``: the stages of the batch-scaling study (``scaling.py``).

    python -m benchmarks.convergence scaling --stage text --text runs/scaling/corpus.txt    # writes the study's text
    python -m benchmarks.convergence scaling --stage plan --text runs/scaling/corpus.txt    # smallest batch, plan.json
    python -m benchmarks.convergence scaling --stage tune --text runs/scaling/corpus.txt    # LAMB's grid per batch
    python -m benchmarks.convergence scaling --stage edges --text runs/scaling/corpus.txt   # past an edge choice
    python -m benchmarks.convergence scaling --stage report --text runs/scaling/corpus.txt  # LAMB and K-FAC per seed
    python -m benchmarks.convergence scaling --stage fit                                    # fits, plots, summary
    python -m benchmarks.convergence scaling --stage probe --text ... --batches 8192 --kfac-lr-scale 0.5  # a cause
    python -m benchmarks.convergence scaling --stage rate   # amendment 7's rate factor from both models' probes
    python -m benchmarks.convergence scaling --stage eigenvalues   # amendment 8's choice from both models' probes
    python -m benchmarks.convergence scaling --stage one-sided     # amendment 9's, from the probes and two cost runs
    python -m benchmarks.convergence scaling --stage report --text ... --kfac-set max_factor_ratio=2  # its reruns

The vocabulary is a WordPiece of ``--vocab-size`` tokens learnt on the training part alone (the held-out parts never
shape it), unless ``--vocab`` names one. Every stage reuses recorded runs, so an interrupted one continues.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.convergence.defaults import kfac_setting
from benchmarks.convergence.parts import Parts, write_parts
from benchmarks.convergence.scaling import QUICK, RULE, Plan, Recorded, Rule, Study, load_plan, write_text
from benchmarks.harness.machine import machine

REPO = Path(__file__).resolve().parents[2]
RECORDS_ONLY = ("rate", "eigenvalues", "one-sided")  # rule stages over both models' recorded probes
STAGES = ("text", "plan", "tune", "edges", "report", "fit", "probe", *RECORDS_ONLY)
VOCAB_SIZE = 8192


def add_parser(sub: Any) -> None:
    c = sub.add_parser("scaling", help="the batch-scaling study (docs/studies/batch_scaling.md): LAMB tuned per "
                                       "batch, K-FAC's defaults at its rate, fits of steps to target against batch",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--stage", choices=STAGES, required=True)
    c.add_argument("--text", type=Path, help="the study's text (split into train / tune / report); every stage but "
                                           "fit needs it")
    c.add_argument("--vocab", type=Path, help="a BERT vocab.txt (default: one learnt on the training part)")
    c.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="the learnt vocabulary's size (%(default)s)")
    c.add_argument("--batches", type=int, nargs="+", help="tokens a step: a subset of the plan's (default: all)")
    c.add_argument("--model-size", choices=["tiny", "mini"], default="tiny")
    c.add_argument("--work", type=Path, help="run folders and prepared data (default: runs/scaling)")
    c.add_argument("--results", type=Path,
                   help="records and plots (default: benchmarks/results/convergence/scaling[_mini])")
    c.add_argument("--quick", action="store_true", help="toy scale (the smoke test's); records go to runs/")
    c.add_argument("--kfac-lr-scale", type=float, default=1.0,
                   help="--stage probe: K-FAC's rate over LAMB's chosen one (%(default)s)")
    c.add_argument("--kfac-set", metavar="KEY=VALUE", nargs="+", default=[], type=kfac_setting,
                   help="--stage probe: kfac-section keys to set (e.g. inv_update_steps=10); --stage report and fit: "
                        "a candidate default's keys, whose pairs run again into b<tokens>/report_<candidate>/")


def study_vocab(parts: Parts, folder: Path, *, size: int) -> Path:
    """A WordPiece vocabulary learnt on the training part (kept while that part and the size are the same)."""
    from bert_pretrain.data.documents import read_documents
    from bert_pretrain.data.tokenizer import train_vocab

    folder = folder / f"vocab_{parts.source_sha256[:12]}_{size}"
    if not (folder / "vocab.txt").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        train_vocab(read_documents([parts.path("train")]), folder, vocab_size=size)
    return folder / "vocab.txt"


def folders(args: argparse.Namespace) -> tuple[Path, Path]:
    """The work folder (runs, prepared data) and the results folder (records, plots) the arguments name."""
    suffix = "" if args.model_size == "tiny" else f"_{args.model_size}"
    if args.quick:
        return (args.work or REPO / "runs" / "scaling_quick" / "work",
                args.results or REPO / "runs" / "scaling_quick" / "results")
    return (args.work or REPO / "runs" / "scaling",
            args.results or REPO / "benchmarks" / "results" / "convergence" / f"scaling{suffix}")


def rule_of(args: argparse.Namespace) -> Rule:
    """The study's rule, or the toy one under ``--quick``."""
    return QUICK if args.quick else RULE


def study_of(args: argparse.Namespace) -> Study:
    rule = rule_of(args)
    if args.text is None:
        raise SystemExit(f"--stage {args.stage} needs --text (the study's text; --stage text writes it)")
    work, results = folders(args)
    parts = write_parts([args.text], work / "parts")
    vocab = args.vocab or study_vocab(parts, work, size=args.vocab_size)
    candidate = dict(args.kfac_set) if args.stage == "report" else {}  # the probe stage names its own records
    return Study(parts=parts, vocab=vocab, work=work, results=results, machine=machine(), rule=rule,
                 model_size=args.model_size, candidate=candidate)


def chosen_batches(plan: Plan, args: argparse.Namespace) -> tuple[int, ...]:
    """``--batches``, or every batch the model's study reports (BERT-mini: amendment 5's three)."""
    wanted = tuple(args.batches or rule_of(args).studied_batches(plan.batches, args.model_size))
    unknown = sorted(set(wanted) - set(plan.batches))
    if unknown:
        raise SystemExit(f"--batches {unknown}: not in the plan's batches {list(plan.batches)}")
    return wanted


def probe_cells(args: argparse.Namespace) -> tuple[Path, list[Any]]:
    """The results root and both models' cells a records-only rule stage reads (``--batches``: a subset)."""
    from benchmarks.convergence.scaling_rate import CELL_BATCHES, both_models_cells

    if args.quick or args.kfac_lr_scale != 1.0 or args.kfac_set:
        raise SystemExit(f"--stage {args.stage} reads both models' recorded probes (scaling/ and scaling_mini/ under "
                         "--results, default benchmarks/results/convergence); it takes only --batches and --results")
    root = args.results or REPO / "benchmarks" / "results" / "convergence"
    return root, both_models_cells(root, args.batches or CELL_BATCHES)


def rate_stage(args: argparse.Namespace) -> dict[str, Any]:
    """Amendment 7: the rate factor from both models' tune-part probes; writes scaling_rate.json and .png."""
    from benchmarks.convergence.scaling_rate import plot_rate, rate_study

    root, cells = probe_cells(args)
    result = {**rate_study(cells), "machine": machine()}
    path = root / "scaling_rate.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    plot = plot_rate(result, root / "scaling_rate.png")
    means = ", ".join(f"c={c}: {gap:+.3f}" for c, gap in result["mean_gap"].items())
    print(f"mean gap to LAMB's final over {len(cells)} cells: {means}\nthe rule chooses c = {result['choice']:g}"
          f"\nwrote {path} and {plot}")
    return result


def eigenvalues_stage(args: argparse.Namespace) -> dict[str, Any]:
    """Amendment 8: the eigenvalue scaling from both models' tune-part probes; writes scaling_eigenvalues.json/.png."""
    from benchmarks.convergence.scaling_eigenvalues import eigenvalue_study, plot_eigenvalues

    root, cells = probe_cells(args)
    result = {**eigenvalue_study(cells), "machine": machine()}
    path = root / "scaling_eigenvalues.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    plot = plot_eigenvalues(result, root / "scaling_eigenvalues.png")
    print(f"mean gap to LAMB's final over {len(cells)} cells: defaults {result['mean_gap']['defaults']:+.3f}, "
          f"adaptive {result['mean_gap']['candidate']:+.3f}\n{'chosen' if result['chosen'] else 'not chosen'}: "
          f"{result['why']}\nwrote {path} and {plot}")
    return result


def one_sided_stage(args: argparse.Namespace) -> dict[str, Any]:
    """Amendment 9: one-sided rotation from both models' tune-part probes and the two cost runs
    (benchmarks/results/one_sided/); writes scaling_one_sided.json/.png."""
    from benchmarks.convergence.scaling_one_sided import one_sided_study, plot_one_sided

    root, cells = probe_cells(args)
    result = {**one_sided_study(cells, cost_folder=root.parent / "one_sided"), "machine": machine()}
    path = root / "scaling_one_sided.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    plot = plot_one_sided(result, root / "scaling_one_sided.png")
    print(f"mean gap to LAMB's final over {len(cells)} cells: defaults {result['mean_gap']['defaults']:+.3f}, "
          f"one-sided {result['mean_gap']['candidate']:+.3f}; overhead {result['overhead']['defaults']:.1%} against "
          f"{result['overhead']['candidate']:.1%}\n{'chosen' if result['chosen'] else 'not chosen'}: {result['why']}"
          f"\nwrote {path} and {plot}")
    return result


def refuse_unread(args: argparse.Namespace) -> None:
    """Options the stage does not read stop it, named (the records-only rule stages name theirs in probe_cells)."""
    if args.stage in RECORDS_ONLY:
        return
    if args.stage != "probe" and args.kfac_lr_scale != 1.0:
        raise SystemExit(f"--kfac-lr-scale: only --stage probe reads it (--stage {args.stage} runs K-FAC at LAMB's "
                         "rate, as the rule says)")
    if args.stage not in ("probe", "report", "fit") and args.kfac_set:
        raise SystemExit(f"--kfac-set: --stage {args.stage} does not read it (probe: a diagnostic; report and fit: a "
                         "candidate default's reruns)")


def main(args: argparse.Namespace) -> dict[str, Any]:
    refuse_unread(args)
    if args.stage == "text":
        path = write_text(rule_of(args), args.text)
        print(f"the study's text: {path} ({path.stat().st_size / 1e6:.1f} MB)")
        return {"text": str(path)}
    if args.stage == "fit":  # the records alone: no text, vocabulary or data cache
        from benchmarks.convergence.scaling_fit import fit_study

        recorded = Recorded(results=folders(args)[1], machine=machine(), rule=rule_of(args),
                            model_size=args.model_size, candidate=dict(args.kfac_set))
        plan = load_plan(recorded.results / "plan.json")
        return fit_study(recorded, plan, batches=chosen_batches(plan, args))
    if args.stage == "rate":  # the records alone, of both models
        return rate_stage(args)
    if args.stage == "eigenvalues":
        return eigenvalues_stage(args)
    if args.stage == "one-sided":
        return one_sided_stage(args)
    study = study_of(args)
    rule: Rule = study.rule
    plan_path = study.results / "plan.json"
    if args.stage == "plan":
        if plan_path.is_file():
            print(f"{plan_path} exists: the plan is fixed once; delete it only if the rule changed")
            return json.loads(plan_path.read_text())
        plan = study.make_plan()
        written = {**asdict(plan), "rule": asdict(rule), "text": str(args.text), "vocab": str(study.vocab),
                   "parts": str(study.parts.folder / "parts.json"), "machine": study.machine}
        plan_path.write_text(json.dumps(written, indent=1) + "\n")
        print(f"plan: {json.dumps(asdict(plan))}\nwrote {plan_path}")
        return written
    plan = load_plan(plan_path)
    batches = chosen_batches(plan, args)
    done: dict[str, Any] = {}
    for tokens in tqdm(batches, desc=f"scaling {args.stage}", unit="batch"):
        regime = rule.regime_for(tokens, steps=plan.steps_at(tokens), model_size=args.model_size)
        if args.stage == "tune":
            done[regime.name] = {k: v for k, v in study.tune(regime).items() if k != "best_record"}
        elif args.stage == "edges":
            done[regime.name] = study.extend_edge(regime)
        elif args.stage == "probe":  # a diagnostic (amendment 6), beside LAMB's tune runs; never a choice
            from benchmarks.convergence.scaling_probe import probe

            done[regime.name] = probe(study, regime, lr_scale=args.kfac_lr_scale, kfac=dict(args.kfac_set))
        else:
            records = study.report(regime, seeds=rule.seeds_for(tokens, plan.batches, model_size=args.model_size))
            done[regime.name] = {opt: [r["final"] for r in rs] for opt, rs in records.items()}
        print(f"{regime.name}: {json.dumps(done[regime.name])[:300]}")
    return done
