"""The fine-tuning recipe: DeepSpeed config file + the job's own sections + command-line overrides.

A ``ds_configs/squad_*.json`` file is a DeepSpeed config (batch sizes, precision, ZeRO, clipping, ``kfac``) with
two sections that this job reads and removes before DeepSpeed sees the rest:

- ``optimizer``: ``{"type": "AdamW", "params": {"lr", "betas", "eps", "weight_decay"}}``. The job builds
  ``torch.optim.AdamW`` from it (DeepSpeed's own AdamW JIT-compiles a fused kernel even on CPU) with no weight
  decay on biases and LayerNorm, as BERT does.
- ``squad_finetune``: epochs, warmup_proportion, window geometry and span-search limits.

Precedence: command-line flag > config file > the defaults below (BERT's SQuAD v1.1 recipe).

Without ``--config`` the file follows the model (:func:`default_config`): BERT's recipe for a model as wide as
BERT-base or wider, the tiny CPU recipe (lr 2e-3, 128-token windows) for the narrow models it was tuned on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kaisa_ds.engine.ds_config import load_config
from kaisa_ds.enums import parse_count

if TYPE_CHECKING:  # imported where used: they pull in datasets and torch, and --help reads the recipe files
    from squad_finetune.features import FeatureSettings
    from squad_finetune.postprocess import SpanSearch

JOB_SECTION = "squad_finetune"
CONFIG_DIR = Path(__file__).resolve().parents[1] / "ds_configs"
RECIPE_CONFIG = CONFIG_DIR / "squad_bert_base.json"  # BERT's SQuAD v1.1 recipe, fp32 (runs on any device)
TINY_CONFIG = CONFIG_DIR / "squad_tiny_cpu.json"  # tuned for bert_pretrain's tiny/mini models on CPU
RECIPE_MIN_HIDDEN = 768  # BERT-base's hidden size: from this width on, a model gets BERT's recipe
OPTIMIZER_KEYS = ("lr", "betas", "eps", "weight_decay")


class ConfigError(ValueError):
    """A config file or option that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class Recipe:
    """Every fine-tuning hyperparameter that is not DeepSpeed's own."""

    epochs: int = 2
    max_steps: int | None = None
    lr: float = 3e-5
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_proportion: float = 0.1
    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    n_best: int = 20
    max_answer_length: int = 30
    seed: int = 42

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ConfigError:
            return ConfigError(f"{name}={getattr(self, name)!r} is not valid; allowed: {allowed}")

        if not _is_number(self.lr) or not self.lr > 0:
            raise bad("lr", "a number > 0")
        if not _is_number(self.eps) or not self.eps > 0:
            raise bad("eps", "a number > 0")
        if not _is_number(self.weight_decay) or self.weight_decay < 0:
            raise bad("weight_decay", "a number >= 0")
        if not _is_number(self.warmup_proportion) or not 0 <= self.warmup_proportion < 1:
            raise bad("warmup_proportion", "a number in [0, 1)")
        if len(self.betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in self.betas):
            raise bad("betas", "two numbers in [0, 1)")
        if not _is_int(self.seed):
            raise bad("seed", "an integer")
        try:  # the library's count reader and the window/search settings' own checks, re-raised as config errors
            parse_count("epochs", self.epochs, meaning="passes over the training features")
            parse_count("max_steps", self.max_steps, allow_none=True,
                        meaning="optimizer steps after which training stops, if the epochs have not ended it")
            _ = (self.features, self.search)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def features(self) -> FeatureSettings:
        from squad_finetune.features import FeatureSettings

        return FeatureSettings(max_seq_length=self.max_seq_length, doc_stride=self.doc_stride,
                               max_query_length=self.max_query_length)

    @property
    def search(self) -> SpanSearch:
        from squad_finetune.postprocess import SpanSearch

        return SpanSearch(n_best=self.n_best, max_answer_length=self.max_answer_length)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


RECIPE_KEYS = tuple(f.name for f in dataclasses.fields(Recipe))
SECTION_KEYS = tuple(k for k in RECIPE_KEYS if k not in OPTIMIZER_KEYS and k != "betas")


def read_config(path: str | Path) -> dict[str, Any]:
    """A DeepSpeed config file as a dict, read as the engine reads it (JSON, or HJSON with comments); errors name
    the file."""
    try:
        return load_config(Path(path))
    except FileNotFoundError as exc:
        raise ConfigError(f"{exc} (see ds_configs/squad_*.json)") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def split_config(
    config: Mapping[str, Any], *, overrides: Mapping[str, Any], source: str = "config"
) -> tuple[Recipe, dict[str, Any]]:
    """(recipe, the DeepSpeed config without the job's sections). ``overrides`` (not None values) win."""
    values, ds_config = _recipe_values(config, overrides=overrides, source=source)
    try:
        recipe = Recipe(**values)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return recipe, ds_config


def _recipe_values(
    config: Mapping[str, Any], *, overrides: Mapping[str, Any], source: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the recipe values the config and overrides set, the rest of the config); the sections' keys checked."""
    ds_config = dict(config)
    values: dict[str, Any] = {}
    optimizer = ds_config.pop("optimizer", None)
    if optimizer is not None:
        if not isinstance(optimizer, dict) or str(optimizer.get("type", "")).lower() != "adamw":
            raise ConfigError(f"{source}: optimizer.type must be \"AdamW\" (SQuAD fine-tuning uses AdamW), "
                              f"got {optimizer!r}")
        params = optimizer.get("params", {})
        unknown = sorted(set(params) - set(OPTIMIZER_KEYS))
        if unknown:
            raise ConfigError(f"{source}: optimizer.params has unknown key(s) {unknown}; allowed: "
                              f"{list(OPTIMIZER_KEYS)}")
        values.update(params)
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
    section = ds_config.pop(JOB_SECTION, {})
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: the {JOB_SECTION!r} section must be a JSON object")
    unknown = sorted(set(section) - set(SECTION_KEYS))
    if unknown:
        raise ConfigError(f"{source}: {JOB_SECTION} has unknown key(s) {unknown}; allowed: {list(SECTION_KEYS)}")
    values.update(section)
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("scheduler", "lr_schedule"):  # kaisa_ds reads lr_schedule only when no scheduler is passed
        if ds_config.get(key) is not None:
            raise ConfigError(f"{source}: remove the {key!r} section; the job applies linear warmup "
                              f"({JOB_SECTION}.warmup_proportion / --warmup-proportion) then linear decay to 0 "
                              "over the run itself")
    return values, ds_config


def default_config(hidden_size: int) -> Path:
    """The config a model gets without ``--config``: BERT's recipe from BERT-base's width on, else the tiny one."""
    return RECIPE_CONFIG if hidden_size >= RECIPE_MIN_HIDDEN else TINY_CONFIG


def recipe_defaults(path: Path) -> dict[str, Any]:
    """Each recipe value a config file gives without overrides, unvalidated (for the help text, which must not
    drift from the files, and must not import what validating needs)."""
    values, _ = _recipe_values(read_config(path), overrides={}, source=str(path))
    return {f.name: values.get(f.name, f.default) for f in dataclasses.fields(Recipe)}
