"""The recipe from config files and flags: precedence, the shipped configs, and bad values named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from squad_finetune.settings import ConfigError, Recipe, read_config, split_config
from tests.support.squad_data import REPO_ROOT

CONFIGS = sorted((REPO_ROOT / "ds_configs").glob("squad_*.json"))


def test_defaults_are_berts_recipe() -> None:
    recipe, ds = split_config({"train_batch_size": 32}, overrides={})
    assert (recipe.lr, recipe.epochs, recipe.warmup_proportion) == (3e-5, 2, 0.1)
    assert (recipe.max_seq_length, recipe.doc_stride, recipe.max_query_length) == (384, 128, 64)
    assert (recipe.n_best, recipe.max_answer_length) == (20, 30)
    assert ds == {"train_batch_size": 32}


def test_precedence_flag_over_config_over_default() -> None:
    config = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.8, 0.9]}},
              "squad_finetune": {"epochs": 3, "doc_stride": 64}, "kfac": {"damping": 0.01}}
    recipe, ds = split_config(config, overrides={"epochs": 5, "lr": None})
    assert (recipe.epochs, recipe.lr, recipe.betas, recipe.doc_stride) == (5, 1e-4, (0.8, 0.9), 64)
    assert ds == {"train_batch_size": 8, "kfac": {"damping": 0.01}}  # the job's sections are removed


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"optimizer": {"type": "Lamb"}}, "optimizer.type must be \"AdamW\""),
        ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torque": 1}}}, "unknown key(s) ['torque']"),
        ({"squad_finetune": {"epoch": 2}}, "unknown key(s) ['epoch']"),
        ({"squad_finetune": {"epochs": 0}}, "epochs=0"),
        ({"squad_finetune": {"warmup_proportion": 1.5}}, "warmup_proportion=1.5"),
        ({"squad_finetune": {"max_seq_length": 100, "max_query_length": 20, "doc_stride": 77}}, "doc_stride=77"),
        ({"optimizer": {"type": "AdamW", "params": {"lr": -1}}}, "lr=-1"),
        ({"scheduler": {"type": "WarmupLR"}}, "remove the 'scheduler' section"),
        # kaisa_ds.initialize reads lr_schedule only when no scheduler is passed; this job always passes its own
        ({"lr_schedule": {"type": "PolyWarmUp", "warmup_proportion": 0.5, "total_steps": 10}},
         "remove the 'lr_schedule' section"),
        ({"lr_schedule": {"type": "PolyWarmUp", "warmup_proportion": 0.5, "total_steps": 10}},
         "squad_finetune.warmup_proportion"),
    ],
)
def test_bad_values_are_named(config: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        split_config(config, overrides={}, source="my.json")
    assert fragment in str(info.value) and "my.json" in str(info.value)


def test_unreadable_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("{ nope")
    with pytest.raises(ConfigError, match=r"c\.json is not valid JSON"):
        read_config(bad)
    with pytest.raises(ConfigError, match=r"absent\.json does not exist \(see ds_configs/squad_"):
        read_config(tmp_path / "absent.json")
    binary = tmp_path / "b.json"
    binary.write_bytes(bytes(range(128, 256)))
    with pytest.raises(ConfigError, match=r"b\.json is not a UTF-8 text file"):
        read_config(binary)


def test_config_is_read_as_the_engine_reads_it(tmp_path: Path) -> None:
    """DeepSpeed accepts HJSON (comments); the job read plain JSON only and refused what the engine takes."""
    path = tmp_path / "commented.json"
    path.write_text('{\n  // fine-tuning\n  "train_batch_size": 8,\n  "squad": {"epochs": 1}\n}\n')
    assert read_config(path) == {"train_batch_size": 8, "squad": {"epochs": 1}}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_parse(path: Path) -> None:
    recipe, ds = split_config(read_config(path), overrides={}, source=str(path))
    assert isinstance(recipe, Recipe)
    assert "train_batch_size" in ds or "train_micro_batch_size_per_gpu" in ds
    if path.name.endswith("_kfac.json"):
        from kaisa_ds import KFACConfig

        section = dict(ds["kfac"])
        section.pop("enabled", None)
        KFACConfig.from_dict(section)  # the section is valid for the K-FAC preconditioner
    if "bert_large" in path.name:
        assert (recipe.lr, recipe.epochs, recipe.warmup_proportion, ds["train_batch_size"]) == (3e-5, 2, 0.1, 32)
        assert ds["fp16"]["enabled"] is True
    json.dumps(ds)


def test_configs_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {"squad_tiny_cpu.json", "squad_bert_large.json", "squad_bert_large_kfac.json"} <= names


@pytest.mark.parametrize("kwargs", [dict(epochs=0), dict(epochs=True), dict(max_steps=0), dict(max_steps=2.5)])
def test_bad_step_counts_are_config_errors_that_say_what_they_count(kwargs: dict[str, object]) -> None:
    """The recipe's counts go through the library's count reader, still as ConfigError (what the loader names)."""
    name = next(iter(kwargs))
    with pytest.raises(ConfigError, match=rf"{name}=.*integer >= 1 \(\w"):
        Recipe(**kwargs)  # type: ignore[arg-type]
