"""The main job, end to end on 2 CPU ranks under the deepspeed launcher.

1. generate the built-in corpus and its SQuAD-style questions (or take --data / --squad-train / --squad-eval);
2. pretrain a BERT twice, phase 1 then phase 2 (seq 512): LAMB, and LAMB + K-FAC with the library's defaults
   (``"kfac": {"enabled": true}``), same seed and data. By default phase 1 runs 8,192 tokens a step (128 sequences
   of 64 tokens, 375 steps: the small regime's token budget), the smallest of the scaling study's batches at or
   above LAMB's fitted critical batch, with LAMB at the rate the study tuned there (``--phase1-batch`` reruns it
   at another batch, mission/batch.py), and K-FAC's phase 1 ends where it first reaches LAMB's final held-out MLM
   loss: that model goes on, as KAISA claims the same quality for less pretraining time
   (benchmarks/results/mission/rule.md and rule_batch.md say how this was chosen, before any run);
3. fine-tune both on SQuAD and score F1/EM;
4. write report.md (and report.json) with a table, held-out MLM loss against steps and training seconds (PNG),
   and the steps and seconds each variant needed to reach LAMB's final held-out MLM loss.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bert_pretrain.intervals import interval_warnings
from mission.batch import DEFAULT_TOKENS, EVALS, TOKEN_BUDGET, eval_interval, phase1_recipe
from mission.jobs import REPO
from mission.report import write_report
from mission.stages import StageRecord, file_digest

logger = logging.getLogger("mission")
VARIANTS = {"LAMB": "", "LAMB + K-FAC": "_kfac"}
# The built-in corpus of the main job: the size (words) of the convergence study's small-regime training part, so
# phase 1 passes over its text about as often as that regime did (benchmarks/results/mission/rule.md).
ARTICLES = 1900
QUESTION_ARTICLES = 200  # the built-in SQuAD questions ask about this many of them: fine-tuning stays short
# Config prefixes per phase when --config-prefix is not given: phase 1 is the main job's own regime, phase 2 the
# standard BERT-tiny phase-2 recipe (one file per recipe: no copies that could drift apart).
DEFAULT_PREFIXES = {1: "ds_configs/bert_tiny_mission", 2: "ds_configs/bert_tiny"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mission", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("runs/mission"), help="where everything is written")
    p.add_argument("--data", type=Path, nargs="*", help="raw text files to pretrain on (default: built-in corpus)")
    p.add_argument("--vocab", type=Path, help="BERT vocab.txt (default: a WordPiece vocab trained on the corpus)")
    p.add_argument("--squad-train", type=Path, help="SQuAD v1.1 train JSON (default: built-in questions)")
    p.add_argument("--squad-eval", type=Path, help="SQuAD v1.1 eval JSON (default: built-in questions)")
    p.add_argument("--model-size", default="tiny", help="tiny (CPU), mini, base or large")
    p.add_argument("--phase1-batch", type=int,
                   help=f"phase-1 tokens a step (default {DEFAULT_TOKENS}: benchmarks/results/mission/rule_batch.md); "
                        "the built-in recipe reshaped to it at the same token budget, LAMB at the rate the scaling "
                        "study tuned there and K-FAC at LAMB's")
    p.add_argument("--phase1-steps", type=int,
                   help=f"phase-1 optimizer steps (default: {TOKEN_BUDGET:,} tokens over the batch; with "
                        "--lamb/--kfac-phase1-config or --config-prefix, the config's lr_schedule.total_steps)")
    p.add_argument("--phase1-seq-length", type=int, default=64, help="phase-1 tokens per sequence")
    p.add_argument("--phase1-max-predictions", type=int, default=10, help="phase-1 masked tokens per sequence at most")
    p.add_argument("--kfac-full-run", action="store_true",
                   help="run K-FAC's phase 1 for all its steps; by default it ends at the first evaluation at or "
                        "below LAMB's final phase-1 held-out MLM loss, and that model goes on to phase 2 and SQuAD")
    p.add_argument("--phase2-steps", type=int, default=30, help="phase-2 optimizer steps")
    p.add_argument("--squad-epochs", type=int, default=4, help="SQuAD fine-tuning epochs")
    p.add_argument("--config-prefix",
                   help="pretraining configs: <prefix>_phase{1,2}[_kfac].json (default: phase 1 "
                        f"{DEFAULT_PREFIXES[1]}_phase1[_kfac].json, phase 2 {DEFAULT_PREFIXES[2]}_phase2[_kfac].json)")
    p.add_argument("--lamb-phase1-config", type=Path,
                   help="phase-1 config of the LAMB variant (default: <prefix>_phase1.json); e.g. tuned settings "
                        "from benchmarks/results/convergence/<regime>/chosen_lamb_ds_config.json")
    p.add_argument("--kfac-phase1-config", type=Path,
                   help="phase-1 config of the K-FAC variant, its kfac section included (default: "
                        "<prefix>_phase1_kfac.json); e.g. benchmarks/results/convergence/<regime>/"
                        "chosen_kfac_ds_config.json")
    p.add_argument("--eval-every", type=int,
                   help="pretraining steps between held-out evaluations (the points of the held-out curves; "
                        f"default: about {EVALS} a phase 1)")
    p.add_argument("--squad-config", type=Path, default=Path("ds_configs/squad_tiny_cpu.json"))
    p.add_argument("--ranks", type=int, default=2, help="processes (CPU ranks or GPUs) per job")
    p.add_argument("--articles", type=int, default=None,
                   help=f"articles of the built-in corpus (default {ARTICLES}) and of its questions (at most "
                        f"{QUESTION_ARTICLES} of them)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of every stage: the built-in data, pretraining and SQuAD fine-tuning")
    p.add_argument("--fresh", action="store_true",
                   help="redo every stage; by default a rerun skips stages finished with the same arguments "
                        "(stages.json) and resumes an interrupted pretraining phase from its last checkpoint")
    args = p.parse_args(argv)
    if (args.squad_train is None) != (args.squad_eval is None):
        given, missing = ("--squad-train", "--squad-eval") if args.squad_train else ("--squad-eval", "--squad-train")
        p.error(f"{given} without {missing}: give both SQuAD v1.1 files (train and eval), or neither for the "
                "built-in questions")
    inputs = [("--data", path) for path in args.data or []] + [
        (flag, path) for flag, path in (("--vocab", args.vocab), ("--squad-train", args.squad_train),
                                        ("--squad-eval", args.squad_eval), ("--squad-config", args.squad_config))
        if path is not None]
    for flag, path in inputs:  # checked now, not when the stage that reads it starts (hours later at full size)
        if not in_repo(path).is_file():
            p.error(f"{flag} {path}: no such file")
    if args.articles and args.data and args.squad_train:
        p.error("--articles sizes the built-in corpus and questions, but --data and --squad-train/--squad-eval "
                "replace both: leave --articles out")
    own = [flag for flag, value in (("--config-prefix", args.config_prefix), ("--lamb-phase1-config",
                                    args.lamb_phase1_config), ("--kfac-phase1-config", args.kfac_phase1_config))
           if value is not None]
    args.recipe = None
    if own and args.phase1_batch is not None:
        p.error(f"--phase1-batch reshapes the built-in phase-1 recipe, but {' and '.join(own)} gives phase 1's "
                "configs: set train_batch_size (and the lr) in those configs, or leave --phase1-batch out")
    if not own:
        try:
            args.recipe = phase1_recipe(tokens=args.phase1_batch or DEFAULT_TOKENS, seq=args.phase1_seq_length,
                                        ranks=args.ranks, steps=args.phase1_steps)
        except ValueError as exc:
            p.error(str(exc))
        args.phase1_steps = args.recipe.steps
    elif args.phase1_steps is None:  # a missing config is refused by input_warnings, naming its flag
        config = in_repo(phase_config(args, phase=1, suffix=""))
        schedule = json.loads(config.read_text()).get("lr_schedule", {}) if config.is_file() else {"total_steps": 0}
        if "total_steps" not in schedule:
            p.error(f"{config} has no lr_schedule.total_steps: give --phase1-steps")
        args.phase1_steps = int(schedule["total_steps"])
    if args.eval_every is None:
        args.eval_every = eval_interval(args.phase1_steps)
    return args


def in_repo(path: str | Path) -> Path:
    """A path as the stages read it: they run in the repository root."""
    return Path(path) if Path(path).is_absolute() else REPO / path


def phase_config(args: argparse.Namespace, *, phase: int, suffix: str) -> str:
    """The DeepSpeed config of one variant's pretraining phase."""
    config = f"{args.config_prefix or DEFAULT_PREFIXES[phase]}_phase{phase}{suffix}.json"
    if phase == 1:
        config = str((args.kfac_phase1_config if suffix else args.lamb_phase1_config) or config)
    return config


def input_warnings(args: argparse.Namespace) -> list[str]:
    """What the report must say about the run's inputs before any figure: questions about other text than the
    pretraining text, and K-FAC intervals as long as a phase (each also logged)."""
    warnings = []
    if args.data and args.squad_train is None:
        warnings.append(f"pretrained on --data {' '.join(map(str, args.data))}, but fine-tuned and scored on the "
                        "built-in SQuAD-style questions, which ask about invented entities that are not in the "
                        "pretraining text: the SQuAD figures do not measure what pretraining on that text learned; "
                        "give --squad-train and --squad-eval for questions about it")
        logger.warning("WARNING: %s", warnings[-1])
    for label, suffix in VARIANTS.items():
        for phase, steps in ((1, args.phase1_steps), (2, args.phase2_steps)):
            config = phase_config(args, phase=phase, suffix=suffix)
            path = in_repo(config)
            if not path.is_file():  # before hours of other stages, not when this one starts
                own = "--kfac-phase1-config" if suffix else "--lamb-phase1-config"
                flag = own if phase == 1 and getattr(args, own[2:].replace("-", "_")) else "--config-prefix"
                raise SystemExit(f"python -m mission: {flag}: {config} does not exist (the {label} variant's "
                                 f"phase-{phase} config; configs are <prefix>_phase{{1,2}}[_kfac].json)")
            warnings += interval_warnings(json.loads(path.read_text()), steps=steps,
                                          source=f"{label}, phase {phase} ({config})")
    if args.eval_every * 2 > args.phase1_steps:
        warnings.append(f"--eval-every {args.eval_every} with --phase1-steps {args.phase1_steps}: the held-out "
                        f"curves have {-(-args.phase1_steps // args.eval_every)} point(s), so the steps and seconds "
                        "to LAMB's final loss are coarse or missing; evaluate more often")
        logger.warning("WARNING: %s", warnings[-1])
    if args.model_size != "tiny":
        defaults = parse_args([])
        for flag, value, default in (("--config-prefix", args.config_prefix, None),
                                     ("--squad-config", args.squad_config, defaults.squad_config)):
            if value == default:
                value = value or f"{DEFAULT_PREFIXES[1]} / {DEFAULT_PREFIXES[2]}"
                warnings.append(f"--model-size {args.model_size} trains with the default {flag} {value}, the "
                                f"recipe made for BERT-tiny on 2 CPU ranks (its learning rate and batch); give "
                                f"{flag} a recipe for this model")
                logger.warning("WARNING: %s", warnings[-1])
    return warnings


def until_lamb_final(args: argparse.Namespace, out: Path, *, suffix: str) -> list[str]:
    """K-FAC's phase-1 flag that ends it at LAMB's final phase-1 held-out MLM loss (LAMB's phase 1 runs first);
    none for LAMB, with --kfac-full-run, or when LAMB's summary has no held-out loss."""
    if not suffix or args.kfac_full_run:
        return []
    summary = out / "lamb" / "phase1" / "summary.json"
    target = json.loads(summary.read_text()).get("heldout_mlm_loss") if summary.is_file() else None
    if target is None:
        logger.warning("WARNING: %s has no held-out MLM loss: K-FAC's phase 1 runs all its steps", summary)
        return []
    return ["--stop-at-heldout", repr(float(target))]


def report_settings(args: argparse.Namespace, *, squad: str) -> dict[str, Any]:
    """What the report says it ran: every setting that changes a figure, the seed included (runs of several seeds
    are told apart and summarised by ``python -m benchmarks.mission_seeds``)."""
    return {"model": args.model_size, "phase1_steps": args.phase1_steps, "phase1_seq_length": args.phase1_seq_length,
            "phase1_batch_tokens": args.recipe.tokens if args.recipe else None,
            "kfac_until_lamb_final": not args.kfac_full_run, "phase2_steps": args.phase2_steps, "ranks": args.ranks,
            "eval_every": args.eval_every, "seed": args.seed,
            "data": " ".join(map(str, args.data)) if args.data else "built-in",
            "vocab": str(args.vocab or "trained on the corpus"), "squad": squad,
            "lamb_phase1_config": phase_config(args, phase=1, suffix=""),
            "kfac_phase1_config": phase_config(args, phase=1, suffix="_kfac")}


def phase1_configs(args: argparse.Namespace, out: Path) -> list[str]:
    """With the built-in recipe, point both variants' phase-1 configs at it for this batch and length: the shipped
    files when they hold it already (the default), else reshaped copies under ``out/configs``. Returns the
    recipe's warning (a batch the scaling study did not tune), logged."""
    if args.recipe is None:
        return []
    for suffix, attr in (("", "lamb_phase1_config"), ("_kfac", "kfac_phase1_config")):
        shipped = f"{DEFAULT_PREFIXES[1]}_phase1{suffix}.json"
        config = json.loads(in_repo(shipped).read_text())
        wanted = args.recipe.apply(config, ranks=args.ranks)
        if wanted != config:
            path = out / "configs" / f"phase1{suffix}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(wanted, indent=2) + "\n")
            shipped = str(path)
        setattr(args, attr, shipped)
    warning = args.recipe.untuned_warning()
    if warning:
        logger.warning("WARNING: %s", warning)
    return [warning] if warning else []


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = (args.output if args.output.is_absolute() else REPO / args.output).resolve()
    warnings = phase1_configs(args, out) + input_warnings(args)
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    stages = 1 + len(VARIANTS) * 3
    bar = tqdm(total=stages, desc="main job", unit="stage")
    squad_train, squad_eval = args.squad_train, args.squad_eval
    data = args.data
    if not data:
        from bert_pretrain.corpus import generate_corpus

        bar.set_postfix_str("generating the built-in corpus")
        corpus = generate_corpus(seed=args.seed, num_articles=args.articles or ARTICLES)
        text = data_dir / "corpus.txt"
        corpus.write_text(text)
        data = [text]
    if squad_train is None:  # parse_args refuses one file without the other
        from squad_finetune.builtin_data import write_builtin_squad

        squad_train, squad_eval, _ = write_builtin_squad(data_dir, seed=args.seed,
                                                         num_articles=args.articles or ARTICLES,
                                                         question_articles=QUESTION_ARTICLES)
    bar.update()
    record = StageRecord(out / "stages.json", fresh=args.fresh)
    data_digest = file_digest([*data, *([args.vocab] if args.vocab else [])])
    squad_digest = file_digest([squad_train, squad_eval])
    runs: dict[str, Path] = {}
    seconds: dict[str, dict[str, float]] = {}
    for label, suffix in VARIANTS.items():
        root = out / ("kfac" if suffix else "lamb")
        runs[label], seconds[label] = root, {}
        common = ["--data", *map(str, data), "--model-size", args.model_size, "--seed", str(args.seed),
                  "--data-cache", str(data_dir / "prepared")]  # one vocab and one set of examples for both runs
        if args.vocab:
            common += ["--vocab", str(args.vocab)]
        for phase, steps in ((1, args.phase1_steps), (2, args.phase2_steps)):
            bar.set_postfix_str(f"{label}: pretraining phase {phase}")
            extra = ["--init-checkpoint", str(root / "phase1" / "final")] if phase == 2 else \
                ["--max-seq-length", str(args.phase1_seq_length), "--max-predictions",
                 str(args.phase1_max_predictions), *until_lamb_final(args, out, suffix=suffix)]
            config = phase_config(args, phase=phase, suffix=suffix)
            phase_args = ["--phase", str(phase), "--config", config, "--output", str(root / f"phase{phase}"),
                          "--max-steps", str(steps), "--eval-every", str(args.eval_every), *common, *extra]
            upstream = record.token(f"{root.name}/phase1") if phase == 2 else data_digest
            seconds[label][f"phase{phase}"] = record.run(
                f"{root.name}/phase{phase}", "bert_pretrain", phase_args,
                output=root / f"phase{phase}" / "summary.json", log=root / f"phase{phase}.log", ranks=args.ranks,
                inputs=[upstream, file_digest([in_repo(config)])], resume_flag="--resume", restart_flag="--overwrite")
            bar.update()
        bar.set_postfix_str(f"{label}: SQuAD fine-tuning")
        squad_args = ["--model", str(root / "phase2" / "final"), "--train-file", str(squad_train), "--eval-file",
                      str(squad_eval), "--config", str(args.squad_config), "--output", str(root / "squad"),
                      "--epochs", str(args.squad_epochs), "--seed", str(args.seed), "--eval-before"]
        seconds[label]["squad"] = record.run(
            f"{root.name}/squad", "squad_finetune", squad_args, output=root / "squad" / "eval_results.json",
            log=root / "squad.log", ranks=args.ranks,
            inputs=[record.token(f"{root.name}/phase2"), squad_digest, file_digest([in_repo(args.squad_config)])])
        bar.update()
    bar.close()
    report = write_report(out, runs, seconds, report_settings(args, squad=f"{squad_train} / {squad_eval}"),
                          warnings=warnings)
    print(f"main job done: report at {report} and {out / 'report.json'} (plots: {out / 'heldout_curves.png'}, "
          f"{out / 'loss_curves.png'}; logs: {out}/*/*.log)")
    return 0
