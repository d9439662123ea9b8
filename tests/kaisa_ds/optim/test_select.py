"""Choosing and configuring LAMB: parameter groups, implementation choice, DeepSpeed config sections."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import BertConfig, BertModel

from kaisa_ds.optim.lamb import Lamb
from kaisa_ds.optim.select import build_lamb, is_lamb_config, lamb_from_ds_config

DS_CONFIGS = Path(__file__).resolve().parents[3] / "ds_configs"


def _tiny_bert() -> BertModel:
    return BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=16))


def test_build_lamb_picks_pure_pytorch_on_cpu_and_logs_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kaisa_ds.optim.select"):
        opt, name = build_lamb(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    assert name == "kaisa_ds.Lamb" and isinstance(opt, Lamb)
    assert "using kaisa_ds.optim.lamb.Lamb" in caplog.text
    assert "NVIDIA Apex is not installed" in caplog.text and "deepspeed" not in caplog.text  # no GPU: no hint


def test_the_unrelated_pypi_apex_package_is_never_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module called 'apex' without NVIDIA's amp_C extension must not even be imported."""
    imported = []

    class Finder:
        def find_spec(self, name: str, *_: Any) -> None:
            if name.split(".")[0] == "apex":
                imported.append(name)
            return None

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    _, name = build_lamb(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    assert name == "kaisa_ds.Lamb" and imported == []


def _fake_fused_lamb(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]],
                     arch_lists: list[str | None] | None = None) -> None:
    """CUDA "available" and DeepSpeed's FusedLamb op replaced by a recorder of its kernel calls (and of the
    TORCH_CUDA_ARCH_LIST its JIT build would read)."""
    import os

    from deepspeed.ops.lamb import fused_lamb

    def kernel(p, out_p, m, v, g, lr, b1, b2, max_coeff, min_coeff, eps, scale, step, eps_mode, bc, decay):  # type: ignore[no-untyped-def]
        calls.append({"scale": scale, "max_coeff": max_coeff, "min_coeff": min_coeff, "decay": decay, "step": step})
        return torch.ones(())

    class FakeBuilder:
        def is_compatible(self, verbose: bool = False) -> bool:
            return True

        def load(self) -> types.SimpleNamespace:
            if arch_lists is not None:
                arch_lists.append(os.environ.get("TORCH_CUDA_ARCH_LIST"))
            return types.SimpleNamespace(lamb=kernel)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fused_lamb, "FusedLambBuilder", FakeBuilder)


def test_auto_keeps_one_lamb_semantics_on_cuda_without_apex(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """DeepSpeed's FusedLamb multiplies the trust-ratio step by sqrt(1-b2^t)/(1-b1^t) (about 0.3 at step 1), so it
    trains differently from Apex's LAMB (measured on an H100: losses 4-6% apart after 3 steps). "auto" must not
    swap it in behind a user's back: without Apex it keeps kaisa_ds's LAMB (Apex semantics) and says how to ask."""
    _fake_fused_lamb(monkeypatch, [])
    with caplog.at_level(logging.INFO, logger="kaisa_ds.optim.select"):
        opt, name = build_lamb(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    assert name == "kaisa_ds.Lamb" and isinstance(opt, Lamb)
    assert '"implementation": "deepspeed"' in caplog.text


def test_deepspeed_fused_lamb_jit_build_gets_an_arch_list_it_can_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed 0.19's JIT builder fails on PyTorch's arch-specific suffix ("9.0a", set by CUDA images for
    Hopper) with int('0a'); the build sees the list without the suffix, and the user's variable is restored."""
    seen: list[str | None] = []
    _fake_fused_lamb(monkeypatch, [], seen)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0a;10.0a+PTX")
    _, name = build_lamb(torch.nn.Linear(2, 2).parameters(), lr=1e-3, implementation="deepspeed")
    import os

    assert name == "deepspeed.FusedLamb" and seen == ["8.0;9.0;10.0+PTX"]
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0 9.0a;10.0a+PTX"


def test_asked_for_deepspeed_fused_lamb_that_is_unavailable_raises() -> None:
    with pytest.raises(RuntimeError, match=r"implementation='deepspeed'.*needs CUDA"):
        build_lamb(torch.nn.Linear(2, 2).parameters(), lr=1e-3, implementation="deepspeed")


def test_deepspeed_fused_lamb_gets_the_global_grad_norm(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Asked for, DeepSpeed's FusedLamb is built; stepped as a client optimizer (no grad_norms) it must still see
    the global norm for its max_grad_norm clipping. The CUDA kernel is replaced by a recorder."""
    calls: list[dict[str, Any]] = []
    _fake_fused_lamb(monkeypatch, calls)
    a, b = torch.zeros(3, requires_grad=True), torch.zeros(4, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="kaisa_ds.optim.select"):
        opt, name = build_lamb([{"params": [a], "weight_decay": 0.01}, {"params": [b], "weight_decay": 0.0}],
                               lr=1e-3, max_grad_norm=2.0, max_coeff=5.0, min_coeff=0.1, implementation="deepspeed")
    assert name == "deepspeed.FusedLamb" and "using DeepSpeed FusedLamb" in caplog.text
    a.grad, b.grad = torch.full((3,), 3.0), torch.full((4,), 4.0)  # global norm sqrt(27 + 64)
    opt.step()
    want_scale = (91**0.5 + 1e-6) / 2.0  # FusedLamb divides the grads by (norm + 1e-6) / max_grad_norm
    assert [c["scale"] for c in calls] == pytest.approx([want_scale, want_scale])
    assert [(c["max_coeff"], c["min_coeff"], c["decay"]) for c in calls] == [(5.0, 0.1, 0.01), (5.0, 0.1, 0.0)]


def test_deepspeed_fused_lamb_that_fails_to_build_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from deepspeed.ops.lamb import fused_lamb

    class BrokenBuilder:
        def is_compatible(self, verbose: bool = False) -> bool:
            return True

        def load(self) -> None:
            raise RuntimeError("nvcc not found")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fused_lamb, "FusedLambBuilder", BrokenBuilder)
    with pytest.raises(RuntimeError, match=r"failed to build.*nvcc not found"):
        build_lamb(torch.nn.Linear(2, 2).parameters(), lr=1e-3, implementation="deepspeed")


def test_lamb_from_ds_config_maps_the_params() -> None:
    section = {"type": "Lamb", "params": {"lr": 0.006, "betas": [0.8, 0.99], "eps": 1e-8, "weight_decay": 0.02,
                                          "bias_correction": False, "max_grad_norm": 0.5, "max_coeff": 10,
                                          "min_coeff": 0.01}}
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    opt, name = lamb_from_ds_config(section, model)
    assert name == "kaisa_ds.Lamb"
    decay, no_decay = opt.param_groups
    assert (decay["lr"], decay["betas"], decay["eps"], decay["weight_decay"], decay["bias_correction"]) == (
        0.006, (0.8, 0.99), 1e-8, 0.02, False)
    assert no_decay["weight_decay"] == 0.0 and opt.defaults["max_grad_norm"] == 0.5
    _, asked = lamb_from_ds_config({"type": "Lamb", "params": {"implementation": "torch"}}, model)
    assert asked == "kaisa_ds.Lamb"
    defaults, _ = lamb_from_ds_config({"type": "lamb"}, model)  # missing keys: Apex FusedLAMB's defaults
    assert (defaults.defaults["lr"], defaults.defaults["eps"], defaults.defaults["max_grad_norm"]) == (1e-3, 1e-6, 1.0)
    assert defaults.param_groups[0]["weight_decay"] == 0.01


def test_use_nvlamb_puts_the_trust_ratio_on_the_parameters_without_weight_decay() -> None:
    """A LayerNorm's step is lr per element without NVLAMB and lr·‖p‖ in norm with it."""
    steps = {}
    for nvlamb in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        torch.nn.init.constant_(model[1].weight, 3.0)
        opt, _ = lamb_from_ds_config({"type": "Lamb", "params": {"lr": 0.1, "use_nvlamb": nvlamb}}, model)
        before = model[1].weight.detach().clone()
        model(torch.randn(8, 4)).pow(3).sum().backward()
        opt.step()
        steps[nvlamb] = float((model[1].weight.detach() - before).norm())
    assert steps[False] == pytest.approx(0.1 * 2, rel=1e-3)  # Adam's first step: lr per element, 4 elements
    assert steps[True] == pytest.approx(0.1 * 6, rel=1e-3)  # ‖p‖ = 3·‖1‖ = 6


@pytest.mark.parametrize(("params", "message"), [
    ({"learning_rate": 1e-3}, r"unknown Lamb key\(s\) \['learning_rate'\]; allowed keys: \['lr', 'betas'"),
    ({"lr": "fast"}, r"optimizer\.params\.lr='fast' is not valid; allowed: a number >= 0"),
    ({"betas": [0.9]}, r"optimizer\.params\.betas=\[0\.9\] is not valid"),
    ({"max_grad_norm": -1}, r"optimizer\.params\.max_grad_norm=-1"),
    ({"bias_correction": 1}, r"optimizer\.params\.bias_correction=1 is not valid; allowed: true or false"),
    ({"use_nvlamb": "yes"}, r"optimizer\.params\.use_nvlamb='yes' is not valid; allowed: true or false"),
    ({"min_coeff": 5, "max_coeff": 1}, "min_coeff must not exceed max_coeff"),
    ({"implementation": "fused"}, r"optimizer\.params\.implementation='fused' is not valid; allowed values: "
                                  r"'auto'.*'deepspeed'"),
])
def test_lamb_from_ds_config_bad_params_say_what_to_fix(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lamb_from_ds_config({"type": "Lamb", "params": params}, torch.nn.Linear(2, 2))


def test_is_lamb_config() -> None:
    assert is_lamb_config({"type": "LAMB"}) and is_lamb_config({"type": "lamb", "params": {}})
    assert not is_lamb_config({"type": "AdamW"}) and not is_lamb_config(None) and not is_lamb_config({})
    with pytest.raises(ValueError, match=r"optimizer\.type must be 'Lamb'"):
        lamb_from_ds_config({"type": "Adam"}, torch.nn.Linear(2, 2))


def test_every_lamb_section_in_ds_configs_builds() -> None:
    sections = [json.loads(p.read_text()).get("optimizer") for p in sorted(DS_CONFIGS.glob("*.json"))]
    lamb_sections = [s for s in sections if is_lamb_config(s)]
    if not lamb_sections:
        pytest.skip(f"no Lamb optimizer sections under {DS_CONFIGS}")
    for section in lamb_sections:
        opt, _ = lamb_from_ds_config(section, torch.nn.Linear(2, 2))
        assert opt.param_groups[0]["lr"] == section["params"]["lr"]
