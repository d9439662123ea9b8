"""Issue 60's scaling study (docs/studies/batch_scaling.md, Part 2): LAMB tuned at every batch, K-FAC at the library's
defaults and LAMB's rate, steps and training time to two fixed targets, from 2,048 to 65,536 tokens a step.

Stages, each reusing every recorded run (``benchmarks.convergence.runner``):

- ``plan``: LAMB's grid at the smallest batch on the tune part (the small regime's length). Its chosen run gives the
  steps to the late target and the gradient noise scale there (the library's probe in ``metrics.jsonl``); from them
  the rule sets every other batch's length and, if fewer than two batches lie above the noise scale, more batches.
  Written once to ``plan.json``; later stages read it and never change it.
- ``tune``: LAMB's grid at each batch of the plan, tune part, the tuning seed.
- ``report``: per batch and seed, LAMB at its chosen rate and ``{"enabled": true}`` at the same rate, report part.
  With a *candidate* (kfac keys a rule chose as the next default, amendment 9) both runs of each pair run again into
  ``b<tokens>/report_<candidate>/``, and the fit reads that folder: the default moves only once every pair exists.
- ``fit``: ``benchmarks.convergence.scaling_fit``: the fits, their bootstrap intervals and the plots.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.convergence import analysis
from benchmarks.convergence.parts import Parts
from benchmarks.convergence.regimes import LIBRARY_DEFAULTS, RANKS, Regime
from benchmarks.convergence.runner import TUNE_SEED, RunSpec, run
from bert_pretrain.curves import Curve, first_crossing
from bert_pretrain.data.documents import DataError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """The study's rule, written before its runs (docs/studies/batch_scaling.md, Part 2 and its amendments)."""

    seq: int = 64  # tokens a sequence
    base_tokens: int = 2048  # the smallest batch: the small regime's 32 sequences
    batches: tuple[int, ...] = (2048, 4096, 8192, 16384, 32768, 65536)  # tokens a step, a factor 2 apart: 32x
    base_lr: float = 0.01  # the small regime's tuned LAMB rate; each grid is centred on its square-root scaling
    lr_factors: tuple[float, ...] = (0.5, 1.0, 2.0)
    warmup: float = 0.1  # of each run's steps
    base_steps: int = 1500  # the small regime's length, at the smallest batch
    length_margin: float = 1.5  # a run: this many times the steps the noise-scale model predicts to the late target
    target_drops: tuple[float, ...] = (0.3, 1.0)  # nats below the plateau (the unigram frequency model's loss)
    max_micro: int = 64  # sequences per rank and pass; more passes accumulate
    evals_per_run: int = 30
    min_eval_every: int = 5
    eval_examples: int = 256
    max_predictions: int = 10
    dupe_factor: int = 2  # masked copies of the text: a run reading it at most twice sees no example twice
    report_seeds: tuple[int, ...] = (1, 2)
    largest_seeds: tuple[int, ...] = (1, 2, 3)  # at the two largest batches
    mini_batches: tuple[int, ...] = (2048, 8192, 32768)  # amendment 5: BERT-mini's three of the list
    # the text: generated worlds (bert_pretrain.corpus) of this many articles each, at these seeds, concatenated
    world_seeds: tuple[int, ...] = tuple(range(100, 108))
    articles_per_world: int = 25_000

    def lr_grid(self, tokens: int) -> tuple[float, ...]:
        """LAMB's rates at a batch: ``lr_factors`` around ``base_lr · √(tokens / base_tokens)``."""
        centre = self.base_lr * math.sqrt(tokens / self.base_tokens)
        return tuple(round(centre * f, 6) for f in self.lr_factors)

    def steps_for(self, tokens: int, *, base_steps: float, noise_tokens: float) -> int:
        """A batch's run length: McCandlish et al.'s ``S(B) = S_min (1 + B_noise / B)``, anchored at the smallest
        batch's measured steps to the late target, times ``length_margin``."""
        if tokens == self.base_tokens:
            return self.base_steps
        s_min = base_steps / (1 + noise_tokens / self.base_tokens)
        return math.ceil(self.length_margin * s_min * (1 + noise_tokens / tokens))

    def batches_above(self, noise_tokens: float) -> tuple[int, ...]:
        """The batch list, grown by factors of 2 until at least two batches lie above the noise scale."""
        out = list(self.batches)
        while sum(b > noise_tokens for b in out) < 2:
            out.append(out[-1] * 2)
        return tuple(out)

    def studied_batches(self, batches: tuple[int, ...], model_size: str) -> tuple[int, ...]:
        """The batches of a plan's ``batches`` a model's study reports: BERT-tiny every one, BERT-mini
        ``mini_batches`` (its plan lists all of the rule's batches, like BERT-tiny's)."""
        return batches if model_size == "tiny" else tuple(b for b in batches if b in self.mini_batches)

    def seeds_for(self, tokens: int, batches: tuple[int, ...], *, model_size: str = "tiny") -> tuple[int, ...]:
        """A batch's report seeds: ``largest_seeds`` at the two largest batches the model studies."""
        studied = self.studied_batches(batches, model_size)
        return self.largest_seeds if tokens in sorted(studied)[-2:] else self.report_seeds

    def regime_for(self, tokens: int, *, steps: int, model_size: str = "tiny") -> Regime:
        """The run-shaping fields of one batch: sequences over 2 ranks, up to ``max_micro`` a pass."""
        sequences, rem = divmod(tokens, self.seq * RANKS)
        if rem or sequences < 1:
            raise ValueError(f"{tokens} tokens a step is not a whole number of {self.seq}-token sequences on "
                             f"{RANKS} ranks")
        micro = min(sequences, self.max_micro)
        gas, rem = divmod(sequences, micro)
        if rem:
            raise ValueError(f"{sequences} sequences a rank do not split into passes of {micro}")
        return Regime(name=f"b{tokens}", model_size=model_size, seq=self.seq, max_predictions=self.max_predictions,
                      micro_batch=micro, gas=gas, steps=steps, tune_steps=steps,
                      eval_every=max(self.min_eval_every, round(steps / self.evals_per_run)),
                      eval_examples=self.eval_examples, lamb_lrs=self.lr_grid(tokens), warmups=(self.warmup,),
                      dampings=(), kfac_lr_scales=(), intervals=(), dupe_factor=self.dupe_factor,
                      notes=f"BERT-{model_size}, {tokens} tokens a step ({micro} x {gas} passes x {RANKS} ranks x "
                            f"{self.seq})")


RULE = Rule()
# the smoke test's toy scale: 12 steps (the probe measures at step 10), targets above the plateau (a toy run
# never goes below it)
QUICK = Rule(seq=32, base_tokens=128, batches=(128, 256, 512), base_steps=12, length_margin=1.5, max_micro=4,
             target_drops=(-3.0, -2.0), evals_per_run=4, min_eval_every=3, eval_examples=16, max_predictions=5,
             dupe_factor=1, report_seeds=(1,), largest_seeds=(1,), world_seeds=(1,), articles_per_world=300,
             mini_batches=(128, 256, 512))


def write_text(rule: Rule, path: Path) -> Path:
    """The study's text: one generated world per seed, concatenated (one world of 200,000 articles is impossible:
    the generator's country names run out). Written once, atomically; an existing file is kept."""
    from bert_pretrain.corpus import generate_corpus

    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    part, tmp = path.with_suffix(".world"), path.with_suffix(".part")
    with tmp.open("w", encoding="utf-8") as out:
        for seed in rule.world_seeds:
            generate_corpus(seed=seed, num_articles=rule.articles_per_world).write_text(str(part))
            out.write(part.read_text(encoding="utf-8").rstrip("\n") + "\n\n")
    part.unlink()
    tmp.rename(path)
    return path


@dataclass(frozen=True)
class Plan:
    """What the smallest batch's LAMB tuning fixed for every later run."""

    base_lr: float  # LAMB's choice at the smallest batch
    base_steps_to_late: float  # its steps to the late target (tune part)
    noise_tokens: float  # the gradient noise scale there, in tokens
    batches: tuple[int, ...]
    steps: dict[str, int]  # per batch (tokens, as text): the run's length

    def steps_at(self, tokens: int) -> int:
        return self.steps[str(tokens)]



def lamb_spec(regime: Regime, *, lr: float, seed: int, part: str) -> RunSpec:
    name = f"lamb_lr{lr:g}" + (f"_seed{seed}" if part == "report" else "")
    return RunSpec(name=name, regime=regime.name, optimizer="lamb", lr=lr, warmup=regime.warmups[0],
                   steps=regime.steps, seed=seed, eval_part=part)


def kfac_spec(regime: Regime, *, lr: float, seed: int, candidate: Mapping[str, Any] | None = None) -> RunSpec:
    """K-FAC as ``"kfac": {"enabled": true}`` gives it (plus a ``candidate``'s keys), at LAMB's chosen rate: no K-FAC
    tuning at any batch."""
    return RunSpec(name=f"kfac_defaults_seed{seed}", regime=regime.name, optimizer=LIBRARY_DEFAULTS, lr=lr,
                   warmup=regime.warmups[0], steps=regime.steps, seed=seed, eval_part="report",
                   kfac=dict(candidate or {}))


def slug(value: Any) -> str:
    """A kfac value as a file name's part: a number or word as it is, a list or schedule as its JSON's letters, digits,
    dots and dashes."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return re.sub(r"[^A-Za-z0-9.\-]", "", text)


def candidate_name(candidate: Mapping[str, Any]) -> str:
    """``max_factor_ratio2`` for ``{"max_factor_ratio": 2}``: the keys and values a candidate sets, sorted."""
    return "_".join(f"{key}{slug(value)}" for key, value in sorted(candidate.items()))


def report_folder(results: Path, regime_name: str, candidate: Mapping[str, Any]) -> Path:
    """Where a batch's report pairs are recorded: ``report/`` for today's defaults, ``report_<candidate>/`` for a
    candidate's reruns (LAMB's twin runs again there, the same day, so each pair's times are comparable)."""
    return results / regime_name / ("report" if not candidate else f"report_{candidate_name(candidate)}")


PLATEAUS = "plateaus.json"


def recorded_plateau(results: Path, record: dict[str, Any], part: str, *, examples: int) -> float:
    """The unigram plateau of ``part`` on the data cache ``record`` was evaluated with, kept in
    ``results/plateaus.json`` once computed: the caches live in the work folder, which a fresh clone lacks, and the
    fit must reproduce its figures from the committed records alone."""
    cache = Path(record["eval_cache"])
    key = f"{part}:{cache.name}:{examples}"
    path = results / PLATEAUS
    known: dict[str, float] = json.loads(path.read_text()) if path.is_file() else {}
    if key in known:
        return float(known[key])
    if not (cache / "vocab.txt").is_file():
        raise DataError(f"{path}: no plateau for {key!r}, and its data cache {cache} is absent; rerun the stage that "
                        f"made the record (it prepares the cache) or restore {path.name} from git")
    known[key] = analysis.frequency_model_loss(cache, part, examples=examples)
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return known[key]


@dataclass(frozen=True)
class Recorded:
    """What the fit reads: a study's records, its rule and model; no text, vocabulary or data cache."""

    results: Path
    machine: dict[str, Any]
    rule: Rule = RULE
    model_size: str = "tiny"
    candidate: Mapping[str, Any] = field(default_factory=dict)  # kfac keys over the defaults (report_folder)

    def plateau(self, record: dict[str, Any], part: str) -> float:
        return recorded_plateau(self.results, record, part, examples=self.rule.eval_examples)


@dataclass(frozen=True)
class Study:
    """Where the study's runs train and are recorded, and what they read."""

    parts: Parts
    vocab: Path
    work: Path
    results: Path
    machine: dict[str, Any]
    rule: Rule = RULE
    model_size: str = "tiny"
    candidate: Mapping[str, Any] = field(default_factory=dict)  # kfac keys over the defaults (report_folder)

    def run(self, spec: RunSpec, regime: Regime) -> dict[str, Any]:
        folder = (report_folder(self.results, regime.name, self.candidate) if spec.eval_part == "report"
                  else self.results / regime.name / spec.eval_part)
        return run(spec, regime, self.parts, vocab=self.vocab, work=self.work, record=folder / f"{spec.name}.json",
                   machine=self.machine)

    def plateau(self, record: dict[str, Any], part: str) -> float:
        return recorded_plateau(self.results, record, part, examples=self.rule.eval_examples)

    def tune_run(self, regime: Regime, lr: float) -> dict[str, Any]:
        """LAMB at ``lr`` on the tune part, tuning seed 0, its rate under ``settings`` for the choice."""
        return {**self.run(lamb_spec(regime, lr=lr, seed=TUNE_SEED, part="tune"), regime), "settings": {"lr": lr}}

    def tune(self, regime: Regime) -> dict[str, Any]:
        """LAMB's grid at one batch on the tune part; the lowest final loss chooses (``chosen.json``)."""
        records = [self.tune_run(regime, lr) for lr in regime.lamb_lrs]
        best = analysis.choose(records)
        edges = analysis.grid_edges(best["settings"], [r["settings"] for r in records])
        chosen = {"regime": asdict(regime), "lamb": best["settings"], "edges": edges,
                  "finals": {f"{r['settings']['lr']:g}": r["final"] for r in records},
                  "criterion": "lowest final held-out MLM loss on the tune part, tuning seed 0"}
        (self.results / regime.name).mkdir(parents=True, exist_ok=True)
        (self.results / regime.name / "chosen.json").write_text(json.dumps(chosen, indent=1) + "\n")
        for edge in edges:
            logger.warning("batch %s: LAMB's choice %s: %s", regime.name, best["settings"], edge)
        return {**chosen, "best_record": best}

    def extend_edge(self, regime: Regime, *, most: int = 2) -> dict[str, Any]:
        """Amendment 4: where LAMB's choice is the grid's smallest or largest rate, one more rate a factor 2 beyond
        it (tune part, seed 0), up to ``most`` times, until the choice is inside; ``chosen.json`` is rewritten with
        every rate tried and the choice before (``previous``). The regime is unchanged, so recorded runs are
        reused."""
        path = self.results / regime.name / "chosen.json"
        chosen = json.loads(path.read_text())
        previous = dict(chosen["lamb"])
        lrs = sorted(float(lr) for lr in chosen["finals"])
        records = [self.tune_run(regime, lr) for lr in lrs]
        for _ in range(most):
            best = analysis.choose(records)
            lr = best["settings"]["lr"]
            if lr not in (lrs[0], lrs[-1]):
                break
            new_lr = round(lr / 2 if lr == lrs[0] else lr * 2, 6)
            records.append(self.tune_run(regime, new_lr))
            lrs = sorted([*lrs, new_lr])
        best = analysis.choose(records)
        edges = analysis.grid_edges(best["settings"], [r["settings"] for r in records])
        chosen.update({"lamb": best["settings"], "edges": edges, "previous": previous,
                       "finals": {f"{r['settings']['lr']:g}": r["final"] for r in records},
                       "amendment": "4: the grid extended beyond an edge (docs/studies/batch_scaling.md)"})
        path.write_text(json.dumps(chosen, indent=1) + "\n")
        return chosen

    def make_plan(self) -> Plan:
        """Tune the smallest batch; the steps to its late target and the noise scale there fix the plan."""
        rule = self.rule
        base = rule.regime_for(rule.base_tokens, steps=rule.base_steps, model_size=self.model_size)
        tuned = self.tune(base)
        best = tuned["best_record"]
        late = self.plateau(best, "tune") - rule.target_drops[-1]
        hit = first_crossing(Curve(**best["curve"]), late)
        if hit is None:
            raise SystemExit(f"LAMB's chosen run at {rule.base_tokens} tokens never reached the late target "
                             f"{late:.3f} in {rule.base_steps} steps: the rule cannot size the other batches")
        noise = noise_at(best, step=hit.step)
        if noise is None:
            raise SystemExit(f"LAMB's chosen run at {rule.base_tokens} tokens logged no noise scale by step "
                             f"{hit.step:.0f}")
        noise_tokens = noise * rule.seq
        batches = rule.batches_above(noise_tokens)
        steps = {str(b): rule.steps_for(b, base_steps=hit.step, noise_tokens=noise_tokens) for b in batches}
        return Plan(base_lr=tuned["lamb"]["lr"], base_steps_to_late=hit.step, noise_tokens=noise_tokens,
                    batches=batches, steps=steps)

    def report(self, regime: Regime, *, seeds: tuple[int, ...]) -> dict[str, list[dict[str, Any]]]:
        """LAMB at its chosen rate and K-FAC's defaults (with the candidate's keys) at the same rate, seed by seed
        (pairs back to back)."""
        chosen = json.loads((self.results / regime.name / "chosen.json").read_text())
        lr = float(chosen["lamb"]["lr"])
        out: dict[str, list[dict[str, Any]]] = {"lamb": [], "kfac": []}
        for seed in seeds:
            out["lamb"].append(self.run(lamb_spec(regime, lr=lr, seed=seed, part="report"), regime))
            out["kfac"].append(self.run(kfac_spec(regime, lr=lr, seed=seed, candidate=self.candidate), regime))
        return out


def noise_at(record: dict[str, Any], *, step: float) -> float | None:
    """The run's noise scale (sequences) where it reached ``step``: its last measurement at or before it (the
    first one after it, for a target reached before the first measurement)."""
    curve = record.get("noise_curve") or {"steps": [], "values": []}
    points = list(zip(curve["steps"], curve["values"]))
    before = [v for s, v in points if s <= step]
    return float(before[-1]) if before else (float(points[0][1]) if points else None)


def load_plan(path: Path) -> Plan:
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run `python -m benchmarks.convergence scaling --stage plan` first")
    raw = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(Plan)}
    return Plan(**{k: v for k, v in raw.items() if k in fields and k != "batches"}, batches=tuple(raw["batches"]))
