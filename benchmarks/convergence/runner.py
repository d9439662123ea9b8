"""One training run through the product's pipeline: ``bert_pretrain`` under the deepspeed launcher on 2 CPU ranks.

Each run trains on the training part only and is evaluated on exactly one other part (``tune`` while tuning,
``report`` for the final figures), so a tuning choice cannot see the report part and a reported figure cannot
come from the tuning part. Its record (settings, curve, the command, and every input: :func:`run_inputs`) is
written as JSON; a record already there with the same inputs and no error is reused, so an interrupted tuning
sweep continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.convergence.parts import Parts, split_recipe
from benchmarks.convergence.regimes import LAMB_SHAPE_KEYS, LIBRARY_DEFAULTS, QUICK_UNITS, Regime, ds_config
from bert_pretrain.curves import heldout_curve, training_curve
from kaisa_ds.engine.ds_config import parse_kfac_section
from kaisa_ds.report.metrics_log import read_rows
from mission.kfac_interval import interval_changes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """What one run trains with; ``kfac`` holds the kfac-section keys (None: LAMB alone)."""

    name: str
    regime: str
    optimizer: str  # "lamb", "kfac" or LIBRARY_DEFAULTS (K-FAC with only ``kfac``'s keys set)
    lr: float
    warmup: float
    steps: int
    seed: int
    eval_part: str  # "tune" or "report"
    kfac: dict[str, Any] | None = None
    lamb_shape: dict[str, Any] | None = None  # PolyWarmUp degree / weight decay other than the shipped config's

    def key(self) -> dict[str, Any]:
        """The spec as a dict; ``lamb_shape`` only when set, so records made before it existed keep their key."""
        key = asdict(self)
        if self.lamb_shape is None:
            del key["lamb_shape"]
        return key

    def ds_config(self, regime: Regime) -> dict[str, Any]:
        """The DeepSpeed config this run trains with."""
        return ds_config(regime, lr=self.lr, warmup=self.warmup, steps=self.steps, kfac=self.kfac,
                         library_defaults=self.optimizer == LIBRARY_DEFAULTS, lamb_shape=self.lamb_shape)


def kfac_keys(settings: dict[str, Any]) -> dict[str, Any]:
    """The kfac-section keys a K-FAC run sets (the rest come from ds_configs/bert_tiny_phase1_kfac.json)."""
    return {"damping": settings["damping"], "factor_update_steps": settings["factor_every"],
            "inv_update_steps": settings["inv_every"]}


PRE_RULE_7_RELATIVE_DAMPING = 100.0  # what an unresolved (None) relative damping meant in records before rule 7
TUNE_SEED = 0  # tuning runs; the final runs use other seeds, so the choice is not fitted to their noise


def tune_spec(*, regime: Regime, settings: dict[str, Any], optimizer: str, seed: int = TUNE_SEED) -> RunSpec:
    """A tuning run on the tune part: ``optimizer`` ("lamb" or "kfac") at one grid point, named after it (and after
    ``seed`` when it is not the tuning seed). The tuning sweep and the defaults study (which reuses LAMB's chosen
    tuning run, and runs it at more seeds when candidates are compared on several) both build it here."""
    name = optimizer + "".join(f"_{k}{v:g}" for k, v in settings.items() if k != "lr_scale")
    name += "" if seed == TUNE_SEED else f"_seed{seed}"
    shape = {k: settings[k] for k in LAMB_SHAPE_KEYS if k in settings}
    return RunSpec(name=name, regime=regime.name, optimizer=optimizer, lr=settings["lr"], warmup=settings["warmup"],
                   steps=regime.tune_steps, seed=seed, eval_part="tune",
                   kfac=kfac_keys(settings) if optimizer == "kfac" else None, lamb_shape=shape or None)


def final_spec(*, regime: Regime, chosen: dict[str, Any], optimizer: str, seed: int) -> RunSpec:
    """A final run on the report part: ``optimizer`` ("lamb" or "kfac") at the settings its tuning chose (K-FAC
    with the regime's final cost levers). The final, ablation, defaults and same-day studies all reuse these
    records, so the spec is built here once."""
    s = chosen[optimizer]
    if s is None:
        raise SystemExit(f"the recorded choice has no {optimizer} settings (tuned with `tune --lamb-only`): run "
                         "`python -m benchmarks.convergence tune` without --lamb-only first (LAMB's runs are reused)")
    return RunSpec(name=f"{optimizer}_seed{seed}", regime=regime.name, optimizer=optimizer, lr=s["lr"],
                   warmup=s["warmup"], steps=regime.steps, seed=seed, eval_part="report",
                   kfac={**kfac_keys(s), **dict(regime.final_kfac)} if optimizer == "kfac" else None)


def train_args(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path, config: Path, out: Path,
               cache: Path, also_on_train: bool = False) -> list[str]:
    """bert_pretrain's command line for this run (``also_on_train``: evaluate the training part too)."""
    evals = [f"{spec.eval_part}={parts.path(spec.eval_part)}"] + ([f"train={parts.path('train')}"] if also_on_train
                                                                   else [])
    return ["--phase", "1", "--config", str(config), "--output", str(out), "--max-steps", str(spec.steps),
            "--seed", str(spec.seed), "--data", str(parts.path("train")), "--vocab", str(vocab),
            "--model-size", regime.model_size, "--max-seq-length", str(regime.seq),
            "--max-predictions", str(regime.max_predictions), "--dupe-factor", str(regime.dupe_factor),
            "--eval-data", *evals, "--eval-every", str(regime.eval_every),
            "--eval-examples", str(regime.eval_examples), "--save-every", "0", "--keep-checkpoints", "1",
            "--data-cache", str(cache)]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_inputs(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path) -> dict[str, Any]:
    """Everything a run's result depends on besides the code: its spec, the regime's run-shaping fields, the
    sources' digest and how they were split, the vocabulary's digest, and the full DeepSpeed config (which
    brings in the shipped phase-1 configs' other keys). A recorded run is reused only when all of it is equal."""
    inputs = {"spec": spec.key(), "regime": regime.run_key(), "parts_sha256": parts.source_sha256,
              "split": parts.recipe, "vocab_sha256": sha256_of(vocab), "ds_config": spec.ds_config(regime)}
    if spec.optimizer == LIBRARY_DEFAULTS:  # its section names few options: the library's defaults shape the run
        inputs["library_defaults"] = library_defaults(section=spec.kfac or {})
    return inputs


def library_defaults(*, section: Mapping[str, Any]) -> dict[str, Any]:
    """Every :class:`~kaisa_ds.config.KFACConfig` option a section leaves at its default (those it does not name),
    as JSON values (enums and dtypes as text), resolved with the section's own keys: a default may follow another
    option (the relative damping follows ``grafting``, defaults_rule_7.md)."""
    config = parse_kfac_section({"kfac": {**section, "enabled": True}}).config  # as the run's engine reads it
    assert config is not None  # enabled
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if not f.name.startswith("_") and f.name not in section}
    damping = config.damping_at(0)
    if "relative_damping" in values and damping.relative:
        values["relative_damping"] = damping.value  # None in the config: the value it resolves to
    if values.get("kl_clip") == "auto":
        values["kl_clip"] = config.value("kl_clip", 0)  # as recorded since rule 6: the clip "auto" resolves to
    return dict(json.loads(json.dumps(values, default=str)))


def recorded_inputs(record: dict[str, Any]) -> dict[str, Any] | None:
    """A record's :func:`run_inputs`: stored in it, or, for records written before the key covered every input,
    computed from what the record says it ran with: the vocab file its command names (None when that file is
    gone: the run cannot be matched), its regime's fields (a ``quick:`` regime split the first QUICK_UNITS units)
    and its spec, with today's shipped phase-1 configs (unchanged, apart from keys every spec overrides, since
    before the first shipped record)."""
    if "inputs" in record:
        return damping_before_rule_7(ungrafted_before_rule_6(dict(record["inputs"])))
    command, spec_fields, regime_fields = record.get("command", []), record.get("spec"), record.get("regime")
    if "--vocab" not in command or not isinstance(spec_fields, dict) or not isinstance(regime_fields, dict):
        return None
    vocab = Path(command[command.index("--vocab") + 1])
    if not vocab.is_file():
        return None
    regime = Regime(**regime_fields)
    max_units = QUICK_UNITS if str(regime_fields.get("notes", "")).startswith("quick:") else None
    parts = Parts(folder=Path(), source_sha256=record.get("parts_sha256", ""), units={},
                  recipe=split_recipe(max_units=max_units))
    return run_inputs(RunSpec(**spec_fields), regime, parts, vocab=vocab)


def ungrafted_before_rule_6(inputs: dict[str, Any]) -> dict[str, Any]:
    """Stored inputs with ``"grafting": "none"`` in a K-FAC section that names its options but not grafting: until
    defaults_rule_6.md made ``gradient`` the default, such a section ran ungrafted, which the shipped configs now
    say outright. A library-defaults run keeps its section: its ``library_defaults`` input holds the grafting."""
    section = inputs.get("ds_config", {}).get("kfac")
    if "library_defaults" in inputs or not isinstance(section, dict) or "grafting" in section:
        return inputs
    config = {**inputs["ds_config"], "kfac": {**section, "grafting": "none"}}
    return {**inputs, "ds_config": config}


def damping_before_rule_7(inputs: dict[str, Any]) -> dict[str, Any]:
    """Stored inputs whose ``library_defaults`` left the relative damping unresolved (None): until
    defaults_rule_7.md the library resolved it to 100 whatever the grafting, so such a record ran at 100."""
    defaults, section = inputs.get("library_defaults"), inputs.get("ds_config", {}).get("kfac") or {}
    if not isinstance(defaults, dict) or "relative_damping" not in defaults or defaults["relative_damping"] is not None:
        return inputs
    mode = section.get("damping_mode", defaults.get("damping_mode"))
    if section.get("damping") is not None or defaults.get("damping") is not None or mode == "absolute":
        return inputs  # absolute damping: no relative damping was in force
    return {**inputs, "library_defaults": {**defaults, "relative_damping": PRE_RULE_7_RELATIVE_DAMPING}}


def run_key(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path, also_on_train: bool) -> dict[str, Any]:
    """:func:`run_inputs`, plus ``also_on_train`` when set (only then: the key of every record made without it stays
    as it was)."""
    inputs = run_inputs(spec, regime, parts, vocab=vocab)
    if also_on_train:
        inputs["also_on_train"] = True
    return inputs


def record_for(record: Path, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """``record``'s content when it exists, succeeded and was made with exactly ``inputs``; None otherwise (a failure
    may have been the machine's, a killed launcher or a broken environment, so a failed record is never reused)."""
    if not record.is_file():
        return None
    old = json.loads(record.read_text())
    return dict(old) if old.get("error") is None and recorded_inputs(old) == inputs else None


def reusable(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path, record: Path,
             also_on_train: bool = False) -> dict[str, Any] | None:
    """``record``'s content when :func:`run` would reuse it instead of training; None otherwise."""
    return record_for(record, run_key(spec, regime, parts, vocab=vocab, also_on_train=also_on_train))


def run(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path, work: Path, record: Path,
        machine: dict[str, Any], also_on_train: bool = False) -> dict[str, Any]:
    """Train (or reuse the record of) one run; returns its record: settings, held-out curve, wall seconds.
    ``also_on_train`` also evaluates a fixed sample of the training part at every evaluation (dropout off, like the
    held-out evaluation): the training loss without dropout's noise, recorded as ``train_eval_curve``."""
    inputs = run_key(spec, regime, parts, vocab=vocab, also_on_train=also_on_train)
    old = record_for(record, inputs)
    if old is not None:
        logger.info("%s: recorded in %s; reused", spec.name, record)
        return old
    if record.is_file():
        logger.info("%s: the record in %s was made with other inputs (or failed); running again", spec.name, record)
    from mission.jobs import launch

    folder = work / spec.regime / spec.eval_part / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "ds_config.json"
    config.write_text(json.dumps(spec.ds_config(regime), indent=1))
    # one data cache per seed (bert_pretrain's --seed also seeds the masking); the evaluation sets inside it are
    # prepared with a fixed seed, so every run is evaluated on the same examples
    cache = work / "data" / f"{regime.model_size}_seq{regime.seq}_seed{spec.seed}"
    # no valid record: whatever an earlier attempt left in the run folder is stale, so the run starts over
    args = [*train_args(spec, regime, parts, vocab=vocab, config=config, out=folder / "run", cache=cache,
                        also_on_train=also_on_train),
            "--overwrite"]
    start = time.perf_counter()
    error = None
    try:
        launch("bert_pretrain", args, ranks=regime.ranks, log=folder / "train.log")
    except RuntimeError as exc:  # e.g. a diverged tuning run (non-finite loss): recorded as failed, not fatal
        error = str(exc)[-2000:]
        logger.warning("%s failed; recorded as failed (log: %s)", spec.name, folder / "train.log")
    wall = time.perf_counter() - start
    rows = read_rows(folder / "run" / "metrics.jsonl")
    curve = heldout_curve(rows, column=f"heldout_{spec.eval_part}_mlm_loss")
    if not curve.values and error is None:
        raise RuntimeError(f"{spec.name}: no heldout_{spec.eval_part}_mlm_loss in {folder / 'run' / 'metrics.jsonl'}")
    result = {"inputs": inputs, "spec": spec.key(), "parts_sha256": parts.source_sha256, "regime": asdict(regime),
              "curve": asdict(curve), "final": None if error else curve.values[-1], "error": error,
              # training MLM loss as logged (dropout on), averaged over each window between evaluations; to tell
              # optimisation from generalisation, also_on_train's dropout-off curve is the one to read (item 2e)
              "train_curve": asdict(training_curve(rows, at=curve.steps)),
              **({"train_eval_curve": asdict(heldout_curve(rows, column="heldout_train_mlm_loss"))}
                 if also_on_train else {}),
              "noise_curve": noise_curve(rows), "kfac_interval": kfac_interval(rows),
              "data_tokens": data_tokens(folder / "run" / "summary.json"),
              "train_seconds": float(rows[-1]["elapsed_s"]) if rows else None, "wall_seconds": round(wall, 1),
              "eval_cache": str(cache), "command": ["deepspeed", "--num_gpus", str(regime.ranks), "--module",
                                                   "bert_pretrain", *args], "machine": machine}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(result, indent=1) + "\n")
    return result


def noise_curve(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The gradient noise scale ``B_simple`` (sequences) the run logged: a LAMB run's probe or K-FAC's diagnostics."""
    steps, values = [], []
    for r in rows:
        noise = r.get("noise_scale") or (r.get("kfac") or {}).get("noise_scale")
        if noise and "step" in r:
            steps.append(float(r["step"]))
            values.append(float(noise["b_simple"]))
    return {"steps": steps, "values": values}


def kfac_interval(rows: list[dict[str, Any]]) -> int | None:
    """The decomposition interval in force at a K-FAC run's end (the ``"auto"`` cost rule's choice, which reads the
    wall clock, so two runs of one spec may differ in it); None for LAMB."""
    changes = interval_changes(rows)
    return changes[-1][1] if changes else None


def data_tokens(summary: Path) -> int | None:
    """The training text's tokens as the run prepared them (its summary.json), to say how often a run read it."""
    if not summary.is_file():
        return None
    tokens = json.loads(summary.read_text()).get("data_tokens")
    return int(tokens) if tokens is not None else None
