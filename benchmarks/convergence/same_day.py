"""K-FAC at the library's defaults and LAMB's final runs again, in pairs on one machine boot, for time ratios.

    python -m benchmarks.convergence.same_day --regime large

The ``defaults`` study reuses LAMB's final records, which may come from another day or another machine: on
2026-11-25 this machine ran the same LAMB step 33% slower than on 2026-11-24, and after a restart the same evening
slower again, which a ratio across machines counts for or against K-FAC. This trains, per seed, LAMB's final run and
the defaults run back to back into ``<regime>/same_day/`` (a separate work folder, so the shipped records stay) and
writes ``<regime>/defaults_same_day.json``: the defaults' ratios against the LAMB run of their own pair, and
``defaults_same_day_train_heldout.png``: training loss beside held-out loss for both. ``--eval-train`` also
evaluates a fixed sample of the training part without dropout (into ``same_day_train_eval/``).
``--tuned-lamb-shape`` trains LAMB, and K-FAC over it, at the PolyWarmUp degree and weight decay that
``benchmarks.convergence lamb-shape`` chose (``<regime>/lamb_shape.json``), into folders and files ending
``_lamb_shape``: the ratios against a LAMB tuned on its schedule shape too. A pair is reused only when both records
were made on one boot of one machine (``boot_id``); otherwise each record another boot made (or a failed one) is
run again, beside the one this boot already made.

``--replot`` trains nothing: it rewrites the report, the JSON and the plot from the pair records already there.

``--tuned`` pairs LAMB's final run with the *tuned* K-FAC's final run instead (``<regime>/same_day_tuned/``,
``tuned_same_day.json``): the ``defaults`` study's tuned rows reuse LAMB's records from whatever boot made them, and
a tuned K-FAC record made on this boot (``<regime>/final/kfac_seed*.json``) is taken into its pair, so only LAMB
trains again. LAMB's run is the same in both kinds of pair: its record from the other kind's folder, made on this
boot, is taken in too. ``--model-size``/``--results``/``--work`` as in ``python -m benchmarks.convergence``
(BERT-mini: ``--model-size mini --results benchmarks/results/convergence/mini``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.convergence import ablation
from benchmarks.convergence.cli import DATA, DEFAULT_VOCAB, FINAL_SEEDS, REPO, regime_of, shipped_results
from benchmarks.convergence.defaults import defaults_spec
from benchmarks.convergence.parts import write_parts
from benchmarks.convergence.plots import plot_train_heldout
from benchmarks.convergence.regimes import REGIMES, Regime, shipped_lamb_shape
from benchmarks.convergence.runner import RunSpec, final_spec, reusable, run
from benchmarks.harness.machine import machine


def boot_of(record: Path) -> str | None:
    """The machine boot a record was made on; None when it is absent, failed, or names none (older records)."""
    if not record.is_file():
        return None
    old = json.loads(record.read_text())
    return None if old.get("error") is not None else ablation.boot_id(old)


def same_boot(records: list[Path]) -> bool:
    """Whether every record exists, succeeded and names one machine boot (records without a boot id never do)."""
    boots = {boot_of(path) for path in records}
    return None not in boots and len(boots) == 1


def keep_this_boot(pair: list[Path], *, boot: str | None) -> None:
    """A pair split across boots is no pair: unless both records share one boot, each record another boot made (or
    none) is removed, so that run trains again here, beside the one this boot already made."""
    if not same_boot(pair):
        for path in pair:
            if boot is None or boot_of(path) != boot:
                path.unlink(missing_ok=True)


def adopt_this_boot(source: Path, target: Path, *, boot: str | None) -> None:
    """Take ``source`` (a record of the same spec, e.g. the tuned K-FAC's final run) into a pair as ``target`` when
    the pair lacks it and ``source`` succeeded on this boot: that run need not train again. ``run`` still reuses it
    only if its inputs equal the pair's."""
    if not target.is_file() and boot is not None and boot_of(source) == boot:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def pair_specs(*, regime: Regime, chosen: dict[str, Any], seed: int, tuned: bool) -> tuple[RunSpec, RunSpec]:
    """LAMB's final run and the K-FAC run it is timed against: the tuned K-FAC's final run, or the defaults."""
    kfac = (final_spec(regime=regime, chosen=chosen, optimizer="kfac", seed=seed) if tuned
            else defaults_spec(regime=regime, lamb=chosen["lamb"], seed=seed, steps=regime.steps))
    return final_spec(regime=regime, chosen=chosen, optimizer="lamb", seed=seed), kfac


def tuned_lamb_shape(out: Path) -> dict[str, Any]:
    """The LAMB shape keys ``lamb-shape`` chose that differ from the shipped config's; refused when there is no
    choice, or when it is the shipped shape (nothing would change)."""
    path = out / "lamb_shape.json"
    if not path.is_file():
        raise SystemExit(f"--tuned-lamb-shape: {path} is missing; make it with `python -m benchmarks.convergence "
                         f"lamb-shape --regime {out.name}`")
    chosen = json.loads(path.read_text())["chosen"]
    shipped = shipped_lamb_shape()
    shape = {k: v for k, v in chosen.items() if v != shipped[k]}
    if not shape:
        raise SystemExit(f"--tuned-lamb-shape: {path} chose the shipped shape {chosen}; the plain pairs already "
                         "measure it")
    return shape


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.convergence.same_day", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regime", choices=sorted(REGIMES), required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=list(FINAL_SEEDS))
    p.add_argument("--eval-train", action="store_true",
                   help="also evaluate a fixed sample of the training part (dropout off) at every evaluation: the "
                        "pairs go to <regime>/same_day_train_eval/ and defaults_same_day_train_eval.json/.png")
    p.add_argument("--tuned-lamb-shape", action="store_true",
                   help="LAMB (and K-FAC over it) at the degree and weight decay `lamb-shape` chose "
                        "(<regime>/lamb_shape.json); pairs go to folders and files ending _lamb_shape")
    p.add_argument("--tuned", action="store_true",
                   help="pair LAMB with the tuned K-FAC's final run (chosen.json's kfac) instead of the defaults; "
                        "a tuned record made on this boot is taken from <regime>/final/")
    p.add_argument("--replot", action="store_true",
                   help="train nothing: rewrite the printed report, the JSON and the plot from the pair records "
                        "already in the folder, whatever boot made them (after the report or the plot changed)")
    p.add_argument("--model-size", choices=["tiny", "mini", "base"],
                   help="override the regime's model, as `python -m benchmarks.convergence --model-size`")
    p.add_argument("--results", type=Path, help="the study's results folder (default: the shipped results)")
    p.add_argument("--work", type=Path, help="run folders (default: runs/convergence_<folder name>)")
    args = p.parse_args(argv)
    if args.tuned and args.tuned_lamb_shape:
        p.error("--tuned with --tuned-lamb-shape: the tuned K-FAC was chosen over LAMB's shipped shape; pair one "
                "or the other")
    regime = regime_of(args.regime, argparse.Namespace(quick=False, steps=None, model_size=args.model_size))
    out = (args.results or shipped_results()) / regime.name
    if not (out / "chosen.json").is_file():
        p.error(f"{out / 'chosen.json'} is missing: LAMB's tuned settings come from it; make it with "
                f"`python -m benchmarks.convergence tune --regime {regime.name}`")
    chosen = json.loads((out / "chosen.json").read_text())
    if args.tuned and chosen.get("kfac") is None:
        p.error(f"--tuned: {out / 'chosen.json'} holds no tuned K-FAC (tuned with --lamb-only); run `python -m "
                f"benchmarks.convergence tune --regime {regime.name}` without --lamb-only first")
    parts = write_parts([DATA / t for t in regime.texts], REPO / "runs" / "convergence" / "parts")
    lamb_chosen = chosen["lamb"]
    stem = "same_day_train_eval" if args.eval_train else "same_day"
    shape = tuned_lamb_shape(out) if args.tuned_lamb_shape else None
    stem += "_lamb_shape" if shape else ""
    variant = "tuned" if args.tuned else "defaults"
    folder = out / (f"{stem}_tuned" if args.tuned else stem)
    work = args.work or REPO / "runs" / f"convergence_{folder.name}"
    lamb: list[dict[str, Any]] = []
    kfac: list[dict[str, Any]] = []
    for seed in tqdm(args.seeds, desc=f"same-day pairs {regime.name} ({variant})", unit="pair"):
        specs = tuple(dataclasses.replace(spec, lamb_shape=shape)
                      for spec in pair_specs(regime=regime, chosen=chosen, seed=seed, tuned=args.tuned))
        paths = [folder / f"{spec.name}.json" for spec in specs]
        if args.replot:
            missing = [path for path in paths if not path.is_file()]
            if missing:
                p.error(f"--replot: {missing[0]} is missing; run without --replot to train it")
            lamb.append(json.loads(paths[0].read_text()))
            kfac.append(json.loads(paths[1].read_text()))
            continue
        info = machine()
        # a record made with other inputs (e.g. the library's defaults since changed) trains again, so it pairs
        # with nothing: once, a LAMB record of an earlier boot stayed as the twin of such a stale K-FAC record and
        # was timed against the K-FAC run that replaced it on this boot
        for spec, path in zip(specs, paths):
            if path.is_file() and reusable(spec, regime, parts, vocab=DEFAULT_VOCAB, record=path,
                                           also_on_train=args.eval_train) is None:
                path.unlink()
        keep_this_boot(paths, boot=info.get("boot_id"))
        if args.tuned:
            adopt_this_boot(out / "final" / paths[1].name, paths[1], boot=info.get("boot_id"))
        # LAMB's run is the same in the defaults pair and the tuned pair: one this boot made for either serves both
        twin = out / (stem if args.tuned else f"{stem}_tuned")
        adopt_this_boot(twin / paths[0].name, paths[0], boot=info.get("boot_id"))
        done = [run(spec, regime, parts, vocab=DEFAULT_VOCAB, work=work, record=path, machine=info,
                    also_on_train=args.eval_train) for spec, path in zip(specs, paths)]
        lamb.append(done[0])
        kfac.append(done[1])
    rows = ablation.seed_rows(lamb, {variant: kfac})
    report_path = out / f"{variant}_{stem}.json"
    # a replotted report keeps the machine its pairs were trained on
    where = (json.loads(report_path.read_text())["machine"] if args.replot and report_path.is_file()
             else machine())
    what = "the tuned K-FAC's final run" if args.tuned else "K-FAC at the library defaults (LAMB's lr and warmup)"
    result = {"note": f"per seed, LAMB's final run and {what} trained on one machine boot (LAMB's run may be "
                      "the other kind of pair's, made on that boot)",
              "regime": regime.name, "model_size": regime.model_size, "seeds": args.seeds, "lamb": lamb_chosen,
              "tuned_kfac": chosen.get("kfac") if args.tuned else None,
              "lamb_shape": shape or shipped_lamb_shape(), "rows": rows,
              "summary": ablation.summarise(rows), "machine": where}
    report_path.write_text(json.dumps(result, indent=1) + "\n")
    kfac_lr = f"lr {chosen['kfac']['lr']}, LAMB's {lamb_chosen['lr']}" if args.tuned else "LAMB's lr"
    plot_train_heldout({"lamb": lamb, variant: kfac}, out=out / f"{variant}_{stem}_train_heldout.png",
                       title=f"{regime.name} regime (BERT-{regime.model_size}), report part: LAMB vs "
                             f"{'the tuned K-FAC' if args.tuned else 'K-FAC at the library defaults'} "
                             f"({kfac_lr}{f', LAMB {shape}' if shape else ''}), seeds "
                             f"{', '.join(map(str, args.seeds))}")
    print(ablation.report(result))
    return result


if __name__ == "__main__":
    main()
