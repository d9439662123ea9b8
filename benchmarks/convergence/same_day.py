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
were made on one boot of one machine (``boot_id``); otherwise both are run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.convergence import ablation
from benchmarks.convergence.cli import DATA, DEFAULT_VOCAB, FINAL_SEEDS, REPO, shipped_results
from benchmarks.convergence.defaults import defaults_spec
from benchmarks.convergence.parts import write_parts
from benchmarks.convergence.plots import plot_train_heldout
from benchmarks.convergence.regimes import REGIMES, shipped_lamb_shape
from benchmarks.convergence.runner import final_spec, run
from benchmarks.harness.machine import machine


def same_boot(records: list[Path]) -> bool:
    """Whether every record exists, succeeded and names one machine boot (records without a boot id never do)."""
    boots = set()
    for path in records:
        if not path.is_file():
            return False
        record = json.loads(path.read_text())
        boot = (record.get("machine") or {}).get("boot_id")
        if record.get("error") is not None or boot is None:
            return False
        boots.add(boot)
    return len(boots) == 1


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
    args = p.parse_args(argv)
    regime = REGIMES[args.regime]
    out = shipped_results() / regime.name
    if not (out / "chosen.json").is_file():
        p.error(f"{out / 'chosen.json'} is missing: LAMB's tuned settings come from it; make it with "
                f"`python -m benchmarks.convergence tune --regime {regime.name}`")
    chosen = json.loads((out / "chosen.json").read_text())
    parts = write_parts([DATA / t for t in regime.texts], REPO / "runs" / "convergence" / "parts")
    lamb_chosen = chosen["lamb"]
    stem = "same_day_train_eval" if args.eval_train else "same_day"
    shape = tuned_lamb_shape(out) if args.tuned_lamb_shape else None
    stem += "_lamb_shape" if shape else ""
    folder = out / stem
    lamb: list[dict[str, Any]] = []
    defaults: list[dict[str, Any]] = []
    for seed in tqdm(args.seeds, desc=f"same-day pairs {regime.name}", unit="pair"):
        specs = tuple(dataclasses.replace(spec, lamb_shape=shape) for spec in (
            final_spec(regime=regime, chosen=chosen, optimizer="lamb", seed=seed),
            defaults_spec(regime=regime, lamb=lamb_chosen, seed=seed, steps=regime.steps)))
        paths = [folder / f"{spec.name}.json" for spec in specs]
        if not same_boot(paths):  # a pair split across boots is no pair: both run again, here
            for path in paths:
                path.unlink(missing_ok=True)
        info = machine()
        done = [run(spec, regime, parts, vocab=DEFAULT_VOCAB, work=REPO / "runs" / f"convergence_{stem}",
                    record=path, machine=info, also_on_train=args.eval_train) for spec, path in zip(specs, paths)]
        lamb.append(done[0])
        defaults.append(done[1])
    rows = ablation.seed_rows(lamb, {"defaults": defaults})
    result = {"note": "per seed, LAMB's final run and K-FAC at the library defaults (LAMB's lr and warmup) trained "
                      "back to back on one machine boot", "regime": regime.name, "seeds": args.seeds,
              "lamb": lamb_chosen, "lamb_shape": shape or shipped_lamb_shape(), "rows": rows,
              "summary": ablation.summarise(rows), "machine": machine()}
    (out / f"defaults_{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot_train_heldout({"lamb": lamb, "defaults": defaults}, out=out / f"defaults_{stem}_train_heldout.png",
                       title=f"{regime.name} regime, report part: LAMB vs K-FAC at the library defaults "
                             f"(LAMB's lr{f', LAMB {shape}' if shape else ''}), seeds "
                             f"{', '.join(map(str, args.seeds))}")
    print(ablation.report(result))
    return result


if __name__ == "__main__":
    main()
