"""One fine-tuning (or evaluation) run, from files and a model directory to eval_results.json.

Data preparation runs identically on every rank (deterministic, seconds); rank 0 writes the outputs. Works under
``deepspeed --num_gpus N --module squad_finetune`` and as a plain single process. Everything that can be checked
without the other ranks (config, model directory, tokenizer, given data files and their [UNK] share) is checked
before the process group starts, so a refused run fails at once on every rank.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import kaisa_ds
from bert_pretrain.data.tokenizer import MAX_UNK_RATE
from kaisa_ds.engine.launch import init_distributed
from kaisa_ds.report.metrics_log import MetricsLog
from squad_finetune.builtin_data import write_builtin_squad
from squad_finetune.coverage import check_unk_share
from squad_finetune.data import load_squad_dataset
from squad_finetune.evaluate import SquadScores, score_predictions
from squad_finetune.features import build_eval_features, build_train_features
from squad_finetune.inference import window_logits
from squad_finetune.model import check_model_dir, load_qa_model, load_tokenizer, model_width
from squad_finetune.postprocess import predict_answers
from squad_finetune.settings import RECIPE_MIN_HIDDEN, ConfigError, Recipe, default_config, read_config, split_config
from squad_finetune.squad_json import SquadFile
from squad_finetune.trainer import TrainPlan, build_optimizer, linear_warmup_schedule, train, train_loader

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOptions:
    """Everything a run needs besides the recipe (which comes from the config file and overrides)."""

    output: Path
    config: Path | None = None  # None: chosen by the model's width (settings.default_config)
    model: Path | None = None
    checkpoint: Path | None = None
    train_file: Path | None = None
    eval_file: Path | None = None
    eval_only: bool = False
    eval_before: bool = False
    eval_batch_size: int = 64
    max_train_articles: int | None = None
    max_eval_articles: int | None = None
    builtin_articles: int | None = None
    builtin_seed: int = 0
    log_every: int = 10
    max_unk_rate: float = MAX_UNK_RATE


@dataclass(frozen=True)
class JobResult:
    scores: SquadScores
    steps: int
    train_seconds: float
    output: Path
    eval_file: Path
    initial_scores: SquadScores | None = None
    kfac: bool = False


def _barrier() -> None:
    from deepspeed import comm as dist

    dist.barrier()


def _given_files(opts: JobOptions) -> tuple[Path | None, Path] | None:
    """(train file or None in eval-only mode, eval file) when given; None for the built-in data."""
    if opts.eval_file is not None and (opts.train_file is not None or opts.eval_only):
        return (None if opts.eval_only else opts.train_file), opts.eval_file
    if opts.train_file is not None or opts.eval_file is not None:
        raise ConfigError("give both --train-file and --eval-file, or neither (built-in data); in --eval-only "
                          "mode --eval-file alone is enough")
    return None


def _builtin_files(opts: JobOptions, rank: int) -> tuple[Path | None, Path]:
    """Generates the built-in QA data (rank 0, the others wait) and returns its files as ``_given_files`` does."""
    data_dir = opts.output / "data"
    if rank == 0:
        write_builtin_squad(data_dir, seed=opts.builtin_seed, num_articles=opts.builtin_articles)
    _barrier()
    from squad_finetune.builtin_data import EVAL_FILE, TRAIN_FILE

    return (None if opts.eval_only else data_dir / TRAIN_FILE), data_dir / EVAL_FILE


@dataclass
class _Data:
    """The questions a run trains and scores on, with their [UNK] share under the model's tokenizer."""

    train_file: Path | None
    eval_file: Path
    train: Any
    evaluation: Any
    eval_squad: SquadFile
    unk_share: dict[str, float]
    overlap: int  # eval questions that are also training questions (same id)


def _load_data(files: tuple[Path | None, Path], tokenizer: Any, opts: JobOptions, source: str) -> _Data:
    """Both files as datasets; refuses a file whose text the tokenizer cannot read (mostly [UNK])."""
    train_file, eval_file = files
    shares: dict[str, float] = {}
    train = None
    if train_file is not None:
        train, _ = load_squad_dataset(train_file, max_articles=opts.max_train_articles)
        shares[str(train_file)] = check_unk_share(tokenizer, train, data=train_file, source=source,
                                                  max_unk_rate=opts.max_unk_rate)
    evaluation, squad = load_squad_dataset(eval_file, max_articles=opts.max_eval_articles)
    shares[str(eval_file)] = check_unk_share(tokenizer, evaluation, data=eval_file, source=source,
                                             max_unk_rate=opts.max_unk_rate)
    overlap = 0 if train is None else len(set(train["id"]) & set(evaluation["id"]))
    if overlap:
        logger.warning("%d of the %d eval questions in %s are also training questions (%s): their F1 measures "
                       "memorisation, not reading; split one file with python -m squad_finetune.split", overlap,
                       len(evaluation), eval_file, train_file)
    return _Data(train_file, eval_file, train, evaluation, squad, shares, overlap)


def _config_path(opts: JobOptions, model_dir: Path) -> Path:
    """--config, else the file the model's width calls for (BERT's recipe from BERT-base's width on)."""
    if opts.config is not None:
        return opts.config
    hidden = model_width(model_dir)
    path = default_config(hidden)
    logger.info("no --config: %s has hidden_size %d (%s BERT-base's %d), so %s", model_dir, hidden,
                ">=" if hidden >= RECIPE_MIN_HIDDEN else "<", RECIPE_MIN_HIDDEN, path)
    return path


def _batch_geometry(ds_config: dict[str, Any]) -> tuple[int, int]:
    """(micro batch per rank, accumulation steps) as DeepSpeed resolves them for this world size."""
    from deepspeed.runtime.config import DeepSpeedConfig

    resolved = DeepSpeedConfig(dict(ds_config))
    return int(resolved.train_micro_batch_size_per_gpu), int(resolved.gradient_accumulation_steps)


class _Evaluator:
    """Eval windows built once; ``run`` scores the engine's current weights."""

    def __init__(self, data: _Data, tokenizer: Any, recipe: Recipe, opts: JobOptions, rank: int) -> None:
        from transformers import DataCollatorWithPadding

        self.examples = data.evaluation
        self.gold = data.eval_squad.gold()
        self.features = build_eval_features(self.examples, tokenizer, recipe.features)
        self.example_index = {qid: i for i, qid in enumerate(self.examples["id"])}
        self.collate = DataCollatorWithPadding(tokenizer)
        self.recipe, self.opts, self.rank = recipe, opts, rank
        logger.info("eval: %d questions, %d windows from %s", len(self.examples), len(self.features), data.eval_file)

    def run(self, model: torch.nn.Module, device: torch.device) -> tuple[SquadScores, dict[str, str]]:
        logits = window_logits(model, self.features, collate=self.collate, batch_size=self.opts.eval_batch_size,
                               device=device, show_progress=self.rank == 0)
        feature_example = torch.tensor([self.example_index[i] for i in self.features["example_id"]])
        predictions = predict_answers(
            example_ids=self.examples["id"], contexts=self.examples["context"], feature_example=feature_example,
            offsets=logits.offsets, start_logits=logits.start, end_logits=logits.end, search=self.recipe.search,
        )
        return score_predictions(self.gold, predictions), predictions


def _model_dir(opts: JobOptions) -> Path:
    model_dir = opts.checkpoint if opts.eval_only and opts.checkpoint is not None else opts.model
    if model_dir is None:
        raise ConfigError("--model is required (a bert_pretrain run's <output>/final or another HF model directory); "
                          "in --eval-only mode give --checkpoint (a fine-tuned model directory) or --model")
    return model_dir


def _check_window_fits(model: Any, recipe: Recipe, model_dir: Path) -> None:
    max_positions = int(getattr(model.config, "max_position_embeddings", recipe.max_seq_length))
    if recipe.max_seq_length > max_positions:
        raise ConfigError(f"max_seq_length={recipe.max_seq_length} exceeds the model's max_position_embeddings="
                          f"{max_positions} ({model_dir}); lower squad_finetune.max_seq_length / --max-seq-length")


@dataclass
class _Trained:
    engine: Any
    steps: int = 0
    seconds: float = 0.0
    initial: SquadScores | None = None


def _fine_tune(
    model: Any, tokenizer: Any, train_examples: Any, *, recipe: Recipe, ds_config: dict[str, Any], opts: JobOptions,
    evaluator: _Evaluator, metrics: MetricsLog, rank: int, world: int,
) -> _Trained:
    """Tokenise the training file, build the engine through kaisa_ds.initialize and train."""
    from transformers import DataCollatorWithPadding

    train_features = build_train_features(train_examples, tokenizer, recipe.features)
    micro, accumulation = _batch_geometry(ds_config)
    plan = TrainPlan.make(len(train_features), micro_batch=micro, accumulation=accumulation, world_size=world,
                          recipe=recipe)
    logger.info("train: %d questions, %d windows; %s", len(train_examples), len(train_features), plan)
    engine, *_ = kaisa_ds.initialize(
        model=model, optimizer=build_optimizer(model, recipe),
        lr_scheduler=linear_warmup_schedule(plan.total_steps, recipe.warmup_proportion), config=ds_config,
    )
    kfac_on = getattr(engine, "kfac", None) is not None  # kaisa_ds warns when a config leaves it off
    metrics.write(dict(event="engine", kfac=kfac_on, micro_batch=micro, accumulation=accumulation,
                       total_steps=plan.total_steps, train_windows=len(train_features)))
    trained = _Trained(engine=engine)
    if opts.eval_before:
        trained.initial, _ = evaluator.run(engine.module, engine.device)
        metrics.write(dict(event="eval", step=0, exact_match=trained.initial.exact_match, f1=trained.initial.f1,
                           questions=trained.initial.total))
    loader, sampler = train_loader(train_features, collate=DataCollatorWithPadding(tokenizer), micro_batch=micro,
                                   rank=rank, world_size=world, seed=recipe.seed)
    result = train(engine, loader, sampler, plan=plan, recipe=recipe, metrics=metrics, log_every=opts.log_every,
                   show_progress=rank == 0)
    trained.steps, trained.seconds = result.steps, result.seconds
    return trained


def run_job(opts: JobOptions, overrides: dict[str, Any]) -> JobResult | None:
    """Run; returns the result on rank 0 (None elsewhere)."""
    model_dir = check_model_dir(_model_dir(opts))
    config_path = _config_path(opts, model_dir)
    recipe, ds_config = split_config(read_config(config_path), overrides=overrides, source=str(config_path))
    if opts.eval_only:
        ds_config.pop("kfac", None)  # no training: no preconditioner hooks
    tokenizer = load_tokenizer(model_dir)
    source = f"the tokenizer of --model {model_dir}"
    given = _given_files(opts)
    data = None if given is None else _load_data(given, tokenizer, opts, source)
    rank, world = init_distributed()
    if rank == 0:
        opts.output.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = _load_data(_builtin_files(opts, rank), tokenizer, opts, source)
    torch.manual_seed(recipe.seed)  # the new span head's initialisation
    model, tokenizer = load_qa_model(model_dir, tokenizer)
    _check_window_fits(model, recipe, model_dir)
    evaluator = _Evaluator(data, tokenizer, recipe, opts, rank)
    metrics = MetricsLog(opts.output / "metrics.jsonl", enabled=rank == 0)
    metrics.write(dict(event="config", recipe=asdict(recipe), world_size=world, model=str(model_dir),
                       config=str(config_path), vocab_size=len(tokenizer), unk_share=data.unk_share,
                       train_file=str(data.train_file), eval_file=str(data.eval_file)))
    if opts.eval_only:
        trained = _Trained(engine=kaisa_ds.initialize(model=model, config=ds_config)[0])
    else:
        trained = _fine_tune(model, tokenizer, data.train, recipe=recipe, ds_config=ds_config, opts=opts,
                             evaluator=evaluator, metrics=metrics, rank=rank, world=world)
    engine = trained.engine
    kfac_on = getattr(engine, "kfac", None) is not None
    scores, predictions = evaluator.run(engine.module, engine.device)
    metrics.write(dict(event="eval", step=trained.steps, exact_match=scores.exact_match, f1=scores.f1,
                       questions=scores.total))
    if rank == 0:
        _write_outputs(opts, scores, predictions, steps=trained.steps, seconds=trained.seconds, labels={
            "model": str(model_dir), "config": str(config_path), "kfac": kfac_on, "vocab_size": len(tokenizer),
            "eval_file": str(data.eval_file), "unk_share": data.unk_share,
            "eval_questions_in_train": data.overlap})
        if not opts.eval_only:
            engine.module.save_pretrained(opts.output / "model")
            tokenizer.save_pretrained(opts.output / "model")
    _barrier()
    if rank != 0:
        return None
    return JobResult(scores=scores, steps=trained.steps, train_seconds=trained.seconds, output=opts.output,
                     eval_file=data.eval_file, initial_scores=trained.initial, kfac=kfac_on)


def _write_outputs(
    opts: JobOptions, scores: SquadScores, predictions: dict[str, str], *, steps: int, seconds: float,
    labels: dict[str, Any],
) -> None:
    """predictions.json and eval_results.json; ``labels`` (model, config, K-FAC, vocabulary) are read from the run."""
    (opts.output / "predictions.json").write_text(json.dumps(predictions, indent=1), encoding="utf-8")
    results = {
        "exact_match": scores.exact_match, "f1": scores.f1, "questions": scores.total,
        "unanswered": scores.missing, **labels, "train_steps": steps, "train_seconds": round(seconds, 2),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (opts.output / "eval_results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
