"""The DeepSpeed config's kfac section and the refusals, checked before any engine is built."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from kaisa_ds.engine.ds_config import check_supported, load_config, parse_kfac_section, poly_warmup_from_config

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "ds_configs").glob("*.json"))


def test_section_absent_or_disabled_means_off() -> None:
    assert not parse_kfac_section({}).enabled
    off = parse_kfac_section({"kfac": {"enabled": False, "damping": 0.01}})
    assert not off.enabled and off.config is None


def test_section_is_parsed_once_into_kfac_config() -> None:
    section = parse_kfac_section({"kfac": {"enabled": True, "damping": {"initial": 0.01, "milestones": [5],
                                                                         "factor": 0.1}, "auto_step": False}})
    assert section.enabled and not section.auto_step and section.config is not None
    assert section.config.value("damping", 6) == pytest.approx(0.001)


@pytest.mark.parametrize(("section", "key"), [
    ({"dampnig": 0.1}, r"kfac\.dampnig.*allowed keys: \[.*'damping'"),
    ({"damping": "high"}, r"kfac\.damping"),
    ({"grad_worker_fraction": 3}, r"kfac\.grad_worker_fraction=3 .*hybrid-opt"),
    ({"enabled": "yes"}, r"kfac\.enabled"),
    ({"factor_update_steps": 0}, r"kfac\.factor_update_steps=0 .*integer >= 1"),
    ({"damping": 0.01, "compute_method": "svd"}, r"kfac\.compute_method.*'eigen-refresh', 'inverse', or 'auto'"),
    ({"lr": 0.1}, r"kfac\.lr .*learning rate"),
    ({"damping_mode": "auto"}, r"^kfac\.damping_mode='auto' is not valid; allowed values: 'relative', 'absolute'"),
    ({"relative_damping": 0}, r"^kfac\.relative_damping=0(\.0)? is not valid; allowed: > 0"),
    ({"relative_damping": {"initial": -1.0}}, r"^kfac\.relative_damping\.initial"),
    ({"damping": 1e-3, "relative_damping": 100}, r"^kfac\.damping and kfac\.relative_damping are both given"),
    ({"max_statistic_rows": 0}, r"^kfac\.max_statistic_rows=0 is not valid; allowed: an integer >= 1 .* or null"),
    ({"max_statistic_rows": "many"}, r"^kfac\.max_statistic_rows='many' is not valid"),
    ({"decomposition_budget": 1.5}, r"^kfac\.decomposition_budget=1\.5 is not valid; allowed: a number in \(0, 1\]"),
])
def test_bad_sections_fail_at_start_up_naming_the_key(section: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        parse_kfac_section({"kfac": section})  # also when disabled: typos surface early


def test_shipped_configs_keep_their_absolute_damping_and_a_bare_section_is_relative() -> None:
    from kaisa_ds.enums import DampingMode

    with_damping = [c for c in CONFIGS if "damping" in json.loads(c.read_text()).get("kfac", {})]
    for path in with_damping:  # their recorded figures were measured with absolute damping
        section = parse_kfac_section(load_config(str(path)) | {"kfac": {**load_config(str(path))["kfac"],
                                                                         "enabled": True}})
        assert section.config is not None and section.config.damping_at(0).mode is DampingMode.ABSOLUTE, path
    bare = parse_kfac_section({"kfac": {"enabled": True}}).config
    assert bare is not None and bare.damping_at(0).mode is DampingMode.RELATIVE


def test_zero3_and_lamb_on_flat_partitions_are_refused() -> None:
    on = parse_kfac_section({"kfac": {"enabled": True}})
    with pytest.raises(ValueError, match="ZeRO stage 3"):
        check_supported({"zero_optimization": {"stage": 3}}, on, lamb=False)
    with pytest.raises(ValueError, match="trust ratio"):
        check_supported({"zero_optimization": {"stage": 1}}, parse_kfac_section({}), lamb=True)
    check_supported({"zero_optimization": {"stage": 2}}, on, lamb=False)  # fine


def test_config_from_path_args_and_hjson(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{\n  // comments are fine, DeepSpeed reads hjson\n  "train_batch_size": 8\n}\n')
    assert load_config(str(path))["train_batch_size"] == 8
    assert load_config(None, argparse.Namespace(deepspeed_config=str(path)))["train_batch_size"] == 8
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(str(tmp_path / "missing.json"))
    original = {"kfac": {"enabled": True}}
    load_config(original)["kfac"]["enabled"] = False
    assert original["kfac"]["enabled"] is True  # the caller's dict is never modified


def test_poly_warmup_section() -> None:
    make = poly_warmup_from_config({"type": "PolyWarmUp", "warmup_proportion": 0.5, "total_steps": 4})
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = make(opt)
    assert opt.param_groups[0]["lr"] == 0.5  # step 1 of 4 with 2 warmup steps (NVIDIA: lr already non-zero)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5**0.5)  # step 2: decay (1 - 2/4) ** 0.5
    with pytest.raises(ValueError, match="lr_schedule"):
        poly_warmup_from_config({"type": "PolyWarmUp", "warmup": 0.1})


class _DataParallel:
    """A stand-in mpu so DeepSpeedConfig can check batch sizes for a target world size without processes."""

    def __init__(self, world: int) -> None:
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_validates(path: Path) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = load_config(str(path))
    section = parse_kfac_section(cfg)
    lamb = str(cfg.get("optimizer", {}).get("type", "")).lower() == "lamb"
    check_supported(cfg, section, lamb=lamb)
    if "lr_schedule" in cfg:
        poly_warmup_from_config(cfg["lr_schedule"])
    world = 2 if ("tiny" in path.name or "cpu" in path.name) else 8
    ds_cfg = {k: v for k, v in cfg.items() if k != "optimizer"}  # LAMB is built by kaisa_ds, not DeepSpeed
    checked = DeepSpeedConfig(json.loads(json.dumps(ds_cfg)), mpu=_DataParallel(world))
    assert checked.train_batch_size == cfg.get("train_batch_size", checked.train_batch_size)


def test_a_binary_config_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(ValueError, match=r"config\.json is not a UTF-8 text file"):
        load_config(path)


UNGRAFTED = {"enabled": True, "grafting": "none"}


@pytest.mark.parametrize(("params", "kfac", "warned"), [
    ({"lr": 0.01, "max_grad_norm": 0}, UNGRAFTED, True),
    ({"lr": 0.01, "max_grad_norm": 0.0}, UNGRAFTED, True),
    ({"lr": 0.01}, UNGRAFTED, False),  # Apex's default 1.0
    ({"lr": 0.01, "max_grad_norm": 1.0}, UNGRAFTED, False),
    ({"lr": 0.01, "max_grad_norm": 0}, {"enabled": False}, False),  # LAMB alone: nothing to say
    ({"lr": 0.01, "max_grad_norm": 0}, {"enabled": True}, False),  # grafted (the default): LAMB sees raw sizes
    # the kfac-size ablation hands LAMB K-FAC's own sizes, as 'none' does: the same advice
    ({"lr": 0.01, "max_grad_norm": 0}, {"enabled": True, "grafting": "kfac-size"}, True),
])
def test_kfac_over_a_lamb_without_its_global_norm_pre_normalisation_is_warned_naming_the_key(
        params: dict[str, float], kfac: dict[str, object], warned: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Ungrafted K-FAC over LAMB with max_grad_norm 0 ended above LAMB in both seeds measured: say so at start."""
    cfg = {"optimizer": {"type": "Lamb", "params": params}, "kfac": kfac}
    with caplog.at_level("WARNING", logger="kaisa_ds.engine.ds_config"):
        check_supported(cfg, parse_kfac_section(cfg), lamb=True)
    messages = [r.getMessage() for r in caplog.records if "max_grad_norm" in r.getMessage()]
    assert bool(messages) is warned
    if warned:
        assert "optimizer.params.max_grad_norm to 1.0" in messages[0]
        assert f"grafting '{kfac['grafting']}'" in messages[0]


@pytest.mark.parametrize("params", [{"lr": 0.01, "max_grad_norm": "abc"}, [0.01]])
def test_a_malformed_lamb_section_is_left_to_the_lamb_builder_which_names_the_key(params: object) -> None:
    """The max_grad_norm advice runs before LAMB is built: a bad value there must reach the builder's refusal
    (naming optimizer.params), not fail first on a bare float() or .get()."""
    from torch import nn

    from kaisa_ds.optim import lamb_from_ds_config

    cfg = {"optimizer": {"type": "Lamb", "params": params}, "kfac": {"enabled": True}}
    check_supported(cfg, parse_kfac_section(cfg), lamb=True)
    with pytest.raises(ValueError, match=r"optimizer\.params"):
        lamb_from_ds_config(cfg["optimizer"], nn.Linear(2, 2))
