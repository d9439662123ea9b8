"""Smoke test of benchmarks.accuracy: the reference is exact, sampling perturbs factors, bf16 only the step."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import accuracy


def test_tiny_run_separates_the_two_levers(tmp_path: Path) -> None:
    out = tmp_path / "acc.json"
    res = accuracy.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--windows", "2",
                         "--variants", "1:fp32", "0.25:fp32", "1:bf16", "--out", str(out)])
    rows = {r["variant"]: r for r in res["rows"]}
    assert rows["1:fp32"]["factor_err_one_window"] == 0 and rows["1:fp32"]["precond_grad_err"] == 0
    assert rows["0.25:fp32"]["factor_err_one_window"] > 0.01  # a quarter of the tokens: visibly different factors
    assert rows["1:bf16"]["factor_err_one_window"] == 0  # decompositions in bf16 leave the factors alone...
    assert 0 < rows["1:bf16"]["precond_grad_err"] < 0.05  # ...and perturb the step by bf16 rounding only
    assert out.is_file() and out.with_suffix(".png").is_file()


def test_variants_must_start_with_the_exact_reference(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        accuracy.main(["--variants", "0.5:fp32", "1:fp32", "--out", str(tmp_path / "x.json")])


def test_pass_subsets_perturb_the_factors_and_keep_less_time(tmp_path: Path) -> None:
    res = accuracy.main(["--size", "tiny", "--batch", "4", "--seq", "16", "--windows", "2", "--passes", "4",
                         "--variants", "1:fp32", "1:fp32:0.25", "--out", str(tmp_path / "acc.json")])
    rows = {r["variant"]: r for r in res["rows"]}
    assert rows["1:fp32:0.25"]["pass_fraction"] == 0.25
    assert rows["1:fp32:0.25"]["factor_err_one_window"] > 0.01  # one pass in four: different factors
