"""step_cost: the interval arithmetic, and a tiny end-to-end run whose JSON holds every figure."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.harness.interval import Interval, amortise
from benchmarks.step_cost.cli import main
from benchmarks.step_cost.measure import COMPONENTS, STEP_STAGES, StepCostRun
from kaisa_ds.enums import ComputeMethod, Grafting


def tiny_run_args(**overrides: Any) -> Namespace:
    """StepCostRun's arguments as the CLI gives them, at toy size (eigen, exact, absolute damping 0.001)."""
    return Namespace(**{"size": "tiny", "vocab": 300, "seq": 16, "batch": 2, "lr": 1e-3, "factor_every": 2,
                        "inv_every": 4, "factor_dtype": None, "sample_fraction": 1.0,
                        "compute_method": ComputeMethod.EIGEN, "inv_dtype": "fp32", "dtype": "fp32",
                        "accumulation": 1, "pass_fraction": 1.0, "damping": None, "relative_damping": None,
                        "grafting": Grafting.NONE, **overrides})


def test_interval_counts_every_kind_of_step_once_per_interval() -> None:
    assert Interval(5, 50).counts() == {"decomposition": 1, "factor": 9, "plain": 40}
    assert Interval(1, 10).counts() == {"decomposition": 1, "factor": 9}  # factors every step: no plain step
    assert Interval(10, 10).counts() == {"decomposition": 1, "plain": 9}
    with pytest.raises(ValueError, match="multiple of --factor-every"):
        Interval(3, 10)


def test_amortise_weights_each_kind_by_its_count() -> None:
    zeros = dict.fromkeys(("hook_extra", *STEP_STAGES, "step_untimed", "factor_capture"), 0.0)
    kinds = {"decomposition": {**zeros, "decomposition": 4.0, "hook_extra": 1.0, "kfac_total": 5.0,
                               "factor_capture": 0.9, "precond_step": 4.0},
             "factor": {**zeros, "hook_extra": 1.0, "kfac_total": 1.0, "factor_capture": 0.9, "precond_step": 0.0},
             "plain": {**zeros, "preconditioning": 0.1, "kfac_total": 0.1, "precond_step": 0.1}}
    res = amortise(kinds, Interval(5, 50), components=COMPONENTS, baseline_step=1.8)
    assert res["seconds_per_step"] == pytest.approx((5.0 + 9 * 1.0 + 40 * 0.1) / 50)  # 0.36 s
    assert res["overhead"] == pytest.approx(0.2)
    assert res["components_seconds_per_step"]["hook_extra"] == pytest.approx(10.0 / 50)
    assert res["components_seconds_per_step"]["decomposition"] == pytest.approx(4.0 / 50)
    assert res["stage_seconds_per_step"] == pytest.approx((4.9 + 9 * 0.9 + 40 * 0.1) / 50)  # callbacks + step()
    assert res["stage_overhead"] == pytest.approx(res["stage_seconds_per_step"] / 1.8)


def test_tiny_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "step_cost.json"
    threads = torch.get_num_threads()
    try:  # one thread: on a busy 2-core machine threaded eigh calls can stall for ~0.5 s each
        main(["--size", "tiny", "--vocab", "300", "--batch", "2", "--seq", "16", "--factor-every", "2",
              "--inv-every", "4", "--repeats", "2", "--warmup", "1", "--decomp-sizes", "16", "32", "--threads", "1",
              "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    data = json.loads(out.read_text())
    assert {"cpu_model", "cpu_cores", "torch", "date"} <= set(data["machine"])
    assert data["machine"]["torch_threads"] == 1
    assert data["settings"]["optimizer"].startswith(("LAMB", "torch.optim.AdamW"))
    assert data["settings"]["kfac_layers"] == 12  # 2 encoder layers x 6 Linear layers; embeddings/heads skipped
    kinds = data["step_kinds"]
    assert set(kinds) == {"decomposition", "factor", "plain"}
    assert data["amortised"]["counts"] == {"decomposition": 1, "factor": 1, "plain": 2}
    for kind, row in kinds.items():
        assert all(row[s] >= 0 for s in ("factor_capture", *STEP_STAGES, "precond_step")), kind
        assert row["precond_step"] >= sum(row[s] for s in STEP_STAGES) * 0.999
    # the step counter really selects the kind: decompositions only on the decomposition step,
    # statistics captured on factor steps and never on plain steps
    assert kinds["decomposition"]["decomposition"] > 0
    assert kinds["factor"]["decomposition"] == kinds["plain"]["decomposition"] == 0
    assert kinds["decomposition"]["factor_capture"] > 0 and kinds["factor"]["factor_capture"] > 0
    assert kinds["plain"]["factor_capture"] == 0
    base = data["baseline"]
    assert base["fwd_bwd_s"] > 0 and base["optimizer_step_s"] > 0
    assert data["amortised"]["overhead"] == pytest.approx(data["amortised"]["seconds_per_step"] / base["step_s"])
    assert len(data["rounds"]) == 2
    assert [r["size"] for r in data["decompositions"]] == [16, 32]
    assert all(r["eigh_fp32_s"] > 0 and r["inverse_fp32_s"] > 0 for r in data["decompositions"])
    cal = data["calibration"]  # what python -m kaisa_ds.plan --calibration reads
    assert cal["gemm_gflops"] > 0 and set(cal["eigh_seconds"]) == {"16", "32"}
    assert cal["settings"] == {"model": "tiny", "micro_batch": 2, "seq": 16}
    from kaisa_ds.plan.cli import main as plan_main

    plan = plan_main(["--model", "tiny", "--vocab", "300", "--micro-batch", "2", "--seq", "16", "--world", "2",
                      "--calibration", str(out), "--factor-update-steps", "2", "--inv-update-steps", "4"])
    assert plan["overhead"]["baseline_step_seconds"] == base["step_s"]  # the measured step: same model and batch
    assert plan["overhead"]["amortised_seconds"] > 0


def test_a_step_times_every_accumulated_pass_and_k_fac_samples_the_passes() -> None:
    """--accumulation runs every pass on both models; --pass-fraction reaches K-FAC's pass sampler."""
    args = tiny_run_args(accumulation=3, pass_fraction=0.34)
    run = StepCostRun(args, torch.device("cpu"))
    forwards = {"base": 0, "kfac": 0}
    for key, model in (("base", run.side_by_side.base), ("kfac", run.kfac.model)):
        query = next(m for n, m in model.named_modules() if n.endswith("layer.0.attention.self.query"))
        query.register_forward_hook(lambda *_, key=key: forwards.__setitem__(key, forwards[key] + 1))
    sampler, decided = run.kfac.feed.pass_sampler, set()
    keeps = sampler.keeps

    def recording(*, step: int, pass_index: int) -> bool:
        kept = keeps(step=step, pass_index=pass_index)
        decided.add((pass_index, kept))
        return kept

    sampler.keeps = recording  # type: ignore[method-assign]
    run.round(["factor"])
    assert forwards == {"base": 3, "kfac": 3}
    assert {i for i, _ in decided} == {0, 1, 2} and len({i for i, kept in decided if kept}) == 2


@pytest.mark.parametrize("flags", [["--accumulation", "0"], ["--pass-fraction", "0"], ["--pass-fraction", "1.5"]])
def test_bad_accumulation_flags_are_refused_by_name(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--size", "tiny", *flags])
    assert exit_info.value.code == 2
    assert flags[0] in capsys.readouterr().err


@pytest.mark.parametrize(("given", "relative", "value"), [({}, False, 0.001), ({"damping": 1e-4}, False, 1e-4),
                                                           ({"relative_damping": 100.0}, True, 100.0)])
def test_the_damping_reaches_k_fac_in_the_mode_given(given: dict[str, float], relative: bool, value: float) -> None:
    """The inverse method's cost depends on the damping (benchmarks.indefinite): step_cost ran every earlier figure
    at an absolute 0.001 it could not change."""
    args = tiny_run_args(compute_method=ComputeMethod.INVERSE, **given)
    damping = StepCostRun(args, torch.device("cpu")).kfac.config.damping_at(0)
    assert damping.relative is relative and damping.value == pytest.approx(value)


def test_a_damping_of_zero_is_refused_by_name_not_replaced() -> None:
    """``--damping 0`` once became the default 0.001 without a word (``or`` treated 0 as unset)."""
    args = tiny_run_args(damping=0.0)
    with pytest.raises(ValueError, match=r"damping=0\.0 is not valid"):
        StepCostRun(args, torch.device("cpu"))


@pytest.mark.parametrize(("flags", "grafting", "kl_clip"), [([], Grafting.NONE, 0.001),
                                                           (["--grafting", "gradient"], Grafting.GRADIENT, None)])
def test_kaisas_step_unless_the_library_defaults_step_is_asked_for(
        flags: list[str], grafting: Grafting, kl_clip: float | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step_cost figure is KAISA's step (KL clip 0.001, no grafting); when the library's default became the
    grafted step (2026-11-28) step_cost silently measured grafting *and* the clip, a step no config takes."""
    from benchmarks.step_cost import cli

    built: list[StepCostRun] = []

    def build_only(args: Namespace) -> dict[str, Any]:
        built.append(StepCostRun(args, torch.device("cpu")))
        return {}

    monkeypatch.setattr(cli, "measure", build_only)
    monkeypatch.setattr(cli, "publish", lambda *a, **k: None)
    monkeypatch.setattr(cli, "report", lambda res: "")
    cli.main(["--size", "tiny", "--vocab", "300", "--batch", "2", "--seq", "16", *flags])
    config = built[0].kfac.config
    assert config.grafting is grafting
    assert config.value("kl_clip", 0) == kl_clip
