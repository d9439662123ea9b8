"""KFACConfig validation: strings for enums, ranges, schedules, and JSON-section parsing."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds import ComputeMethod, DistributedStrategy, KFACConfig, KFACPreconditioner, StepSchedule
from tests.support.models import TinyMLP


def test_strings_are_accepted_for_enums_and_dtypes() -> None:
    cfg = KFACConfig(compute_method="INVERSE", grad_worker_fraction="mem_opt", factor_dtype="bf16", inv_dtype="fp64")
    assert cfg.method is ComputeMethod.INVERSE
    assert cfg.grad_worker_fraction is DistributedStrategy.MEM_OPT
    assert cfg.storage_dtype is torch.bfloat16 and cfg.inv_dtype is torch.float64



@pytest.mark.parametrize("given", [None, "auto"])
def test_inv_dtype_auto_is_bf16_on_cuda_and_fp32_elsewhere(given: str | None) -> None:
    cfg = KFACConfig(inv_dtype=given) if given else KFACConfig()  # the default, and the word spelled out
    assert cfg.inv_dtype_on(torch.device("cuda", 0)) is torch.bfloat16
    assert cfg.inv_dtype_on(torch.device("cpu")) is torch.float32 and cfg.inv_dtype_on(None) is torch.float32


def test_an_explicit_inv_dtype_holds_on_every_device() -> None:
    cfg = KFACConfig.from_dict({"inv_dtype": "fp32"})
    assert cfg.inv_dtype_on(torch.device("cuda")) is torch.float32 and cfg.inv_dtype_on(None) is torch.float32


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"damping": 0.0}, "damping"),
        ({"factor_decay": 1.0}, "factor_decay"),
        ({"kl_clip": -1.0}, "kl_clip"),
        ({"factor_update_steps": 0}, "factor_update_steps"),
        ({"inv_update_steps": 2.5}, "inv_update_steps"),
        ({"compute_method": "cholesky"}, "compute_method"),
        ({"grad_worker_fraction": 0.0}, "grad_worker_fraction"),
        ({"grad_worker_fraction": "half"}, "grad_worker_fraction"),
        ({"factor_dtype": "int8"}, "factor_dtype"),
        ({"decomposition_dtype": "fp16"}, "decomposition_dtype"),
        ({"skip_layers": ["("]}, "skip_layers"),
        ({"allreduce_bucket_cap_mb": 0}, "allreduce_bucket_cap_mb"),
        ({"loss_reduction": "max"}, "loss_reduction"),
        ({"max_factor_ratio": 0.5}, "max_factor_ratio"),
        ({"max_factor_ratio": True}, "max_factor_ratio"),
        ({"max_factor_ratio": "2"}, "max_factor_ratio"),
    ],
)
def test_invalid_values_name_the_argument(kwargs: dict, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        KFACPreconditioner(TinyMLP(), **kwargs)


def test_callable_schedules_are_range_checked_when_evaluated() -> None:
    cfg = KFACConfig(damping=lambda step: 0.1 if step < 2 else -1.0)
    assert cfg.value("damping", 1) == 0.1
    with pytest.raises(ValueError, match="damping"):
        cfg.value("damping", 2)


def test_kl_clip_none_disables() -> None:
    assert KFACConfig(kl_clip=None).value("kl_clip", 0) is None


def test_from_dict_builds_step_schedules_and_rejects_unknown_keys() -> None:
    cfg = KFACConfig.from_dict({"damping": {"initial": 0.01, "milestones": [10, 20], "factor": 0.5},
                                "inv_update_steps": {"initial": 50, "milestones": [5], "factor": 0.5}})
    assert isinstance(cfg.damping, StepSchedule)
    assert [cfg.value("damping", s) for s in (0, 10, 25)] == [0.01, 0.005, 0.0025]
    assert [cfg.value("inv_update_steps", s) for s in (0, 5)] == [50, 25]
    with pytest.raises(ValueError, match=r"kfac: unknown key\(s\) \['dampng'\]"):
        KFACConfig.from_dict({"dampng": 0.1})
    with pytest.raises(ValueError, match=r"kfac\.damping\.initial"):
        KFACConfig.from_dict({"damping": {"initial": -1}})
    with pytest.raises(ValueError, match=r"kfac\.skip_layers"):
        KFACConfig.from_dict({"skip_layers": 3})
    with pytest.raises(ValueError, match=r"^kfac\.grad_worker_fraction=3 is not valid"):  # among other keys
        KFACConfig.from_dict({"damping": 0.01, "grad_worker_fraction": 3, "kl_clip": 0.001})
    with pytest.raises(ValueError, match=r"^kfac\.inv_dtype='fp8' is not valid"):
        KFACConfig.from_dict({"inv_dtype": "fp8"})


def test_grad_worker_fraction_must_divide_world() -> None:
    from kaisa_ds.distributed.assignment import resolve_grad_workers

    assert resolve_grad_workers(0.5, 4) == 2
    assert resolve_grad_workers(DistributedStrategy.MEM_OPT, 8) == 1
    with pytest.raises(ValueError, match="grad_worker_fraction"):
        resolve_grad_workers(0.75, 4)  # 3 workers do not divide 4 ranks
    with pytest.raises(ValueError, match="grad_worker_fraction"):
        resolve_grad_workers(0.1, 4)  # below 1/world


def test_auto_strategy_is_mem_opt_on_cpu_ranks_and_kaisas_comm_opt_elsewhere() -> None:
    from kaisa_ds.distributed.assignment import resolve_grad_workers

    assert KFACConfig(grad_worker_fraction="auto").grad_worker_fraction is DistributedStrategy.AUTO
    assert resolve_grad_workers("auto", 8, cpu_ranks=True) == 1  # type: ignore[arg-type]
    assert resolve_grad_workers(DistributedStrategy.AUTO, 8, cpu_ranks=False) == 8
    assert resolve_grad_workers(0.5, 8, cpu_ranks=True) == 4  # an explicit choice stands on CPU ranks too


def test_skip_layers_match_names_and_class_names() -> None:
    model = TinyMLP()
    assert list(KFACPreconditioner(model, skip_layers=["fc2"]).layers) == ["fc1"]
    with pytest.raises(ValueError, match=r"no module it can precondition.*Linear \(88 parameters: skip_layers\)"):
        KFACPreconditioner(TinyMLP(), skip_layers="Linear")


def test_damping_is_relative_unless_an_absolute_value_is_given() -> None:
    from kaisa_ds.enums import DampingMode

    assert KFACConfig().damping_at(0).mode is DampingMode.RELATIVE
    assert KFACConfig(damping=1e-4).damping_at(0) == KFACConfig(damping_mode="ABSOLUTE", damping=1e-4).damping_at(0)
    assert KFACConfig(damping=1e-4).damping_at(0).mode is DampingMode.ABSOLUTE  # old configs keep their meaning
    assert KFACConfig(damping_mode="absolute").damping_at(0).value == 1e-3  # the old library default
    cfg = KFACConfig.from_dict({"relative_damping": {"initial": 10.0, "milestones": [5], "factor": 0.1},
                                "damping_mode": "relative"})
    assert cfg.damping_mode is DampingMode.RELATIVE  # an enum past the config boundary
    assert [cfg.damping_at(s).value for s in (0, 5)] == pytest.approx([10.0, 1.0])
    # keywords on top of a config: an absolute damping replaces the default relative one
    precond = KFACPreconditioner(TinyMLP(), config=KFACConfig(), damping=1e-4)
    assert precond.config.damping_at(0).mode is DampingMode.ABSOLUTE


def test_the_default_relative_damping_follows_the_grafting() -> None:
    """Under grafting the damping shapes only the direction, and the tune parts chose less of it than KAISA's ungrafted
    step, whose damping also sets the step's size (defaults_rule_7.md); the ungrafted step keeps the damping its
    configs and records were measured with. A damping given wins, and keywords on top of a config still merge."""
    grafted, kaisa = KFACConfig().damping_at(0), KFACConfig(grafting="none").damping_at(0)
    assert grafted.relative and kaisa.relative
    assert grafted.value < kaisa.value
    assert KFACConfig(grafting="none", relative_damping=3.0).damping_at(0).value == 3.0
    assert KFACConfig(relative_damping=3.0).damping_at(0).value == 3.0
    merged = KFACPreconditioner(TinyMLP(), config=KFACConfig(), grafting="none").config
    assert merged.damping_at(0) == kaisa


def test_the_default_kl_clip_follows_a_grafting_given_on_top_of_a_config() -> None:
    """``kl_clip: "auto"`` means no clip under grafting and KAISA's clip without (defaults_rule_6.md); a keyword that
    changes ``grafting`` on top of a config must change the clip with it, not keep the one the config resolved."""
    kaisa_clip = KFACConfig(grafting="none").value("kl_clip", 0)
    assert kaisa_clip is not None and KFACConfig().value("kl_clip", 0) is None
    ungrafted = KFACPreconditioner(TinyMLP(), config=KFACConfig(), grafting="none").config
    assert ungrafted.value("kl_clip", 0) == kaisa_clip
    grafted = KFACPreconditioner(TinyMLP(), config=KFACConfig(grafting="none"), grafting="gradient").config
    assert grafted.value("kl_clip", 0) is None
    assert KFACPreconditioner(TinyMLP(), config=KFACConfig(kl_clip=0.01), grafting="none").config.value(
        "kl_clip", 0) == 0.01  # a clip given stays


@pytest.mark.parametrize(
    ("kwargs", "argument", "key"),
    [
        ({"damping_mode": "adaptive"}, r"^damping_mode='adaptive' is not valid; allowed values: 'relative', 'abs",
         r"^kfac\.damping_mode='adaptive' is not valid"),
        ({"relative_damping": 0.0}, r"^relative_damping=0.0 is not valid; allowed: > 0",
         r"^kfac\.relative_damping=0.0 is not valid; allowed: > 0"),
        ({"relative_damping": -1}, r"^relative_damping=-1 is not valid", r"^kfac\.relative_damping=-1(\.0)? is not"),
        ({"damping": 1e-3, "relative_damping": 10.0}, r"^damping and relative_damping are both given",
         r"^kfac\.damping and kfac\.relative_damping are both given"),
        ({"damping_mode": "relative", "damping": 1e-3}, r"^damping_mode='relative' with damping given",
         r"^kfac\.damping_mode='relative' with kfac\.damping given"),
        ({"damping_mode": "absolute", "relative_damping": 1.0}, r"^damping_mode='absolute' with relative_damping",
         r"^kfac\.damping_mode='absolute' with kfac\.relative_damping"),
    ],
)
def test_bad_damping_options_name_the_argument_and_the_config_key(kwargs: dict, argument: str, key: str) -> None:
    with pytest.raises(ValueError, match=argument):
        KFACConfig(**kwargs)
    with pytest.raises(ValueError, match=key):
        KFACConfig.from_dict(kwargs)


def test_inv_update_steps_takes_auto_and_refuses_other_words_by_key() -> None:
    assert KFACConfig.from_dict({"inv_update_steps": "auto"}).auto_interval
    assert not KFACConfig.from_dict({"inv_update_steps": 50}).auto_interval
    with pytest.raises(ValueError, match=r"^kfac\.inv_update_steps='automatic' is not valid; allowed: 'auto'"):
        KFACConfig.from_dict({"inv_update_steps": "automatic"})
    with pytest.raises(ValueError, match="inv_update_steps='often'"):
        KFACConfig(inv_update_steps="often")
    with pytest.raises(ValueError, match="inv_update_steps is 'auto'"):  # a number only once the batch is known
        KFACConfig(inv_update_steps="auto").value("inv_update_steps", 0)
    assert KFACConfig(inv_update_steps=7).inv_update_steps_at(3, rows=8192) == 7
    assert KFACConfig(inv_update_steps="auto").inv_update_steps_at(3, rows=8192) == 10


def test_the_default_method_is_the_eigenbasis_refresh_on_cuda_and_exact_eigh_elsewhere() -> None:
    from kaisa_ds.enums import ComputeMethod

    auto, pinned = KFACConfig(), KFACConfig(compute_method="eigen")
    assert auto.method_on(torch.device("cuda")) is ComputeMethod.EIGEN_REFRESH
    assert auto.method_on(torch.device("cpu")) is auto.method_on(None) is ComputeMethod.EIGEN
    assert auto.method is ComputeMethod.EIGEN  # the layout a checkpoint or a receiver allocates, on every device
    assert pinned.method_on(torch.device("cuda")) is ComputeMethod.EIGEN
    assert type(KFACPreconditioner(TinyMLP()).grouped.method).__name__ == "EigenMethod"  # on this CPU


def test_eigenvalues_auto_is_kroneckers_wherever_another_option_asks_for_kfacs_own() -> None:
    """A damping only exists for K-FAC's own λ_G λ_A + γ, the inverse method has no eigenbasis, and the ungrafted
    step's size is K-FAC's own: there "auto" keeps Kronecker, so KAISA's recipes keep the step they were measured
    with; an explicit "adaptive" beside them is refused naming both keys."""
    from kaisa_ds.damping import DEFAULT_EIGENVALUES
    from kaisa_ds.enums import Eigenvalues

    assert KFACConfig().scaling is DEFAULT_EIGENVALUES
    for kept in ({"damping": 1e-3}, {"relative_damping": 10}, {"damping_mode": "absolute"},
                 {"compute_method": "inverse"}, {"grafting": "none"}, {"grafting": "kfac-size"}):
        assert KFACConfig(**kept).scaling is Eigenvalues.KRONECKER, kept
        with pytest.raises(ValueError, match=r"eigenvalues='adaptive'.*drop"):
            KFACConfig(eigenvalues="adaptive", **kept)
    assert KFACConfig(eigenvalues="ADAPTIVE").scaling is Eigenvalues.ADAPTIVE
    with pytest.raises(ValueError, match=r"kfac\.eigenvalues.*'kronecker'.*'adaptive'.*or 'auto'"):
        KFACConfig.from_dict({"eigenvalues": "measured"})
