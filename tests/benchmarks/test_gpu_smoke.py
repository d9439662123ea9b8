"""The GPU suite's dry run: every part's code on the CPU at toy shapes, and its refusals of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu.cli import main
from tests.support.launch import REPO_ROOT

CPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO_ROOT)}


@pytest.mark.slow  # run it before a GPU session: python -m pytest -m slow tests/benchmarks/test_gpu_smoke.py
def test_cpu_smoke_runs_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        code = main(["--cpu-smoke", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    suite = json.loads((out / "gpu_suite.json").read_text())
    assert code == 0, suite
    assert list(suite["parts"]) == ["tests", "defaults", "step_cost", "eigh", "diagnose"]
    defaults = json.loads((out / "gpu_defaults.json").read_text())
    assert [c["size"] for c in defaults["cases"]] == ["tiny"] and defaults["cases"][0]["cost_interval"] is not None
    assert defaults["cases"][0]["overhead"] > -1 and not defaults["skipped"]
    diag = json.loads((out / "gpu_diagnose.json").read_text())
    assert [r["speedup"] > 0 for r in diag["alignment"]] == [True] * 3
    assert diag["fp16_exact"]["grams"] > 0 and diag["fp16_exact"]["nonfinite_outputs"] == []
    assert "aten::" in diag["profile"]["plain"] and "aten::" in diag["profile"]["factor"]
    cases = diag["effectiveness"]
    assert list(cases) == ["bf16_align-default", "bf16_align-default_full-reduction", "fp32_align-default",
                           "bf16_align1", "inverse_bf16_align-default", "inverse_fp32_align-default"]
    assert [c["bf16_reduced_precision_reduction"] for c in cases.values()] == [True, False, True, True, True, True]
    assert [c["method"] for c in cases.values()] == ["eigen"] * 4 + ["inverse"] * 2
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction  # the part restores the setting
    for case in cases.values():  # every preconditioned layer measured, its cosine a real one
        assert case["layers"] == 12 and -1 <= case["min_cosine"] <= case["median_cosine"] <= 1 + 1e-5
    tests = json.loads((out / "gpu_tests.json").read_text())
    assert tests["counts"]["failed"] == tests["counts"]["error"] == 0 and tests["counts"]["passed"] >= 10
    fused = [t for t in tests["tests"] if "fused_lamb" in t["test"]]
    assert fused and all(t["outcome"] == "skipped" for t in fused)  # CUDA itself: not faked on a CPU
    cost = json.loads((out / "gpu_step_cost.json").read_text())
    assert cost["kaisa"]["factor_every"] == 5 and cost["kaisa"]["inv_every"] == 50  # read from the phase-1 config
    assert cost["lamb"]["optimizer"].startswith("LAMB") and cost["probe"][0]["fits"]
    assert [r["sample_fraction"] for r in cost["runs"]] == [1.0, cost["kaisa"]["sample_fraction"]]
    for run in cost["runs"]:
        assert set(run["stage_shares"]) == {"statistics", "reduction", "decomposition", "preconditioning", "other"}
        assert run["baseline_step_s"] > 0 and run["step_cost"]["amortised"]["counts"]["decomposition"] == 1
    eigh = json.loads((out / "gpu_eigh.json").read_text())
    row = eigh["sizes"][0]
    methods = [k for k in row if k.endswith("_s_per_matrix")]
    assert len(methods) == 6 and all(row[k] > 0 for k in methods)
    assert eigh["round_seconds_one_gpu"][eigh["fastest_eigen_method"]] > 0
    # the step seconds come from this call's step_cost JSON, measured before the eigh part
    assert eigh["intervals"] and all(i["min_inv_update_steps"] >= 1 for i in eigh["intervals"])
    for png in ("gpu_step_cost.png", "gpu_eigh.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # ~8 s
def test_cpu_smoke_of_the_levers_times_accumulated_steps(tmp_path: Path) -> None:
    """--job-gpus makes a step one GPU's accumulated passes; every lever combination is one run, with the
    decompositions' split over the job's GPUs."""
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        code = main(["--cpu-smoke", "--part", "step_cost", "--out", str(out), "--job-gpus", "4",
                     "--pass-fractions", "0.5", "--compute-methods", "eigen", "inverse", "--sample-fractions", "0.5",
                     "--inv-dtype", "fp32", "--relative-damping", "100"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    cost = json.loads((out / "gpu_step_cost.json").read_text())
    assert cost["accumulation"] == 2 and cost["job_gpus"] == 4
    assert [(r["method"], r["pass_fraction"]) for r in cost["runs"]] == [("eigen", 0.5), ("inverse", 0.5)]
    for run in cost["runs"]:
        settings = run["step_cost"]["settings"]
        assert settings["accumulation"] == 2 and settings["pass_fraction"] == 0.5
        assert settings["compute_method"] == run["method"]
        assert settings["inv_dtype"] == run["inv_dtype"] == "fp32"  # not the phase-1 config's bf16
        assert settings["relative_damping"] == 100  # the library's mode, not the absolute 0.001 of earlier figures
        split = run["decomposition_split"]
        assert 0.25 <= split["busiest_share"] < 1  # 4 GPUs share the factors: none does all, none less than 1/4
        assert split["overhead_split"] < run["overhead"]


def test_without_cuda_the_suite_refuses_at_once() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--part", "eigh"], cwd=REPO_ROOT, env=CPU_ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device here" in proc.stderr and "--cpu-smoke" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_on_a_gpu_the_parts_must_be_named(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main([]) == 2
    assert "--part" in capsys.readouterr().err


def test_a_missing_wheel_is_named_with_the_command_that_builds_it(tmp_path: Path) -> None:
    whl = tmp_path / "whl"
    whl.mkdir()
    (whl / "deepspeed-0.19.8-py3-none-any.whl").write_bytes(b"")
    env = {**CPU_ENV, "WHL_DIR": str(whl), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "scripts/gpu_suite.sh", "--part", "eigh"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "pydantic" in proc.stderr and "deepspeed" not in proc.stderr.split("for:")[1].split("(")[0]
    assert "scripts/build_gpu_wheels.sh" in proc.stderr


def test_diagnose_runs_only_the_chosen_pieces_and_cases(tmp_path: Path) -> None:
    """A short device call spends its minutes on the open question only (call 7: the inverse method's cases)."""
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        code = main(["--cpu-smoke", "--part", "diagnose", "--out", str(out), "--pieces", "effectiveness",
                     "--cases", "inverse_bf16_align-default", "inverse_fp32_align-default"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    diag = json.loads((out / "gpu_diagnose.json").read_text())
    assert "fp16_exact" not in diag and "profile" not in diag
    cases = diag["effectiveness"]
    assert list(cases) == ["inverse_bf16_align-default", "inverse_fp32_align-default"]
    assert [(c["method"], c["inv_dtype"]) for c in cases.values()] == [("inverse", "bf16"), ("inverse", "fp32")]
    assert all(c["layers"] == 12 for c in cases.values())


def test_an_unknown_effectiveness_case_is_refused_with_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cpu-smoke", "--part", "diagnose", "--cases", "inverse_bf8"]) == 2
    err = capsys.readouterr().err
    assert "inverse_bf8" in err and "inverse_bf16_align-default" in err


def test_the_step_cost_settings_come_from_the_library_reader(tmp_path: Path) -> None:
    """Keys a config leaves out take the library's own defaults (not literals beside it), and dtypes come back as the
    flag names step_cost takes, aliases included."""
    from benchmarks.gpu.bert_cost import kaisa_settings
    from kaisa_ds.config import KFACConfig

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 64, "kfac": {"enabled": True, "factor_dtype": "float16"}}))
    settings = kaisa_settings(path)
    library = KFACConfig()
    assert settings["inv_every"] == library.inv_update_steps and settings["factor_every"] == library.factor_update_steps
    assert settings["sample_fraction"] == library.factor_sample_fraction
    assert settings["grad_worker_fraction"] == library.grad_worker_fraction
    assert (settings["factor_dtype"], settings["inv_dtype"]) == ("fp16", "bf16")  # inv_dtype "auto" on a GPU
    assert settings["config"] == str(path)
    json.dumps(settings)  # it goes into the suite's JSON report as it is
    path.write_text(json.dumps({"train_batch_size": 64, "kfac": {"enabled": True, "factor_dtype": "fp64"}}))
    with pytest.raises(ValueError, match=r"factor_dtype='?(fp64|torch.float64)"):
        kaisa_settings(path)  # a dtype the step cost's flags cannot name is refused by its option's name
