"""The README's headline (the per-batch table of the scaling study, and the main job's sentence) says what its
records say.

A rerun rewrites ``benchmarks/results/convergence/scaling/summary.json`` or the main job's ``seeds.json``; this test
then fails until the README's figures follow, so the headline cannot drift from the measurements behind it. Figures
are compared at the decimals the README prints.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SUMMARY = REPO / "benchmarks/results/convergence/scaling/summary.json"
SEEDS = REPO / "benchmarks/results/mission/seeds_batch8192/seeds.json"
TABLE_HEADER = "| tokens a step | K-FAC's time to LAMB's final loss, × LAMB's |"
SPREAD = re.compile(r"^(?P<mean>\d+\.\d+) ± (?P<std>\d+\.\d+)$")
REACHED = re.compile(r"^(?P<k>\d+) of (?P<n>\d+)$")
MAIN_JOB = re.compile(r"in \*\*(?P<mean>\d+\.\d+) ± (?P<std>\d+\.\d+)\*\* of LAMB's training time")


def headline_rows() -> list[list[str]]:
    """The per-batch table's body rows, each as its cells (bold marks removed)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(TABLE_HEADER))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("**", "") for cell in line.strip().strip("|").split(" | ")])
    return rows


ROWS = headline_rows()


def batch_of(cells: list[str]) -> str:
    match = re.match(r"^([\d,]+)", cells[0])
    assert match, f"row {cells[0]!r} does not start with its batch"
    return match[1].replace(",", "")


def test_the_table_covers_every_batch_of_the_study() -> None:
    plan = json.loads((SUMMARY.parent / "plan.json").read_text())
    assert [batch_of(cells) for cells in ROWS] == [str(b) for b in plan["batches"]]


@pytest.mark.parametrize("cells", ROWS, ids=[cells[0][:20] for cells in ROWS])
def test_row_matches_the_fit(cells: list[str]) -> None:
    per_batch: dict[str, Any] = json.loads(SUMMARY.read_text())["per_batch"]
    tokens = batch_of(cells)
    if "not rerun" in cells[1]:
        assert tokens not in per_batch, f"{tokens}: the summary has it now; the README must say what it found"
        return
    versus = per_batch[tokens]["kfac_to_lamb_final"]
    time, steps, reached, overhead = cells[1:5]
    match = SPREAD.match(time)
    assert match, f"{tokens}: expected 'mean ± std' in {time!r}"
    assert float(match["mean"]) == pytest.approx(versus["time_ratio"]["mean"], abs=0.0051), tokens
    assert float(match["std"]) == pytest.approx(versus["time_ratio"]["std"], abs=0.0051), tokens
    assert float(steps) == pytest.approx(versus["step_ratio"]["mean"], abs=0.0051), tokens
    k_of_n = REACHED.match(reached)
    assert k_of_n, f"{tokens}: expected 'k of n' in {reached!r}"
    n = versus["time_ratio"]["n"]
    assert (int(k_of_n["k"]), int(k_of_n["n"])) == (n, n + versus["time_ratio"]["missing"]), tokens
    assert float(overhead.rstrip("%")) == pytest.approx(100 * per_batch[tokens]["kfac_step_overhead"], abs=0.051)


def test_the_main_job_sentence_matches_its_seeds() -> None:
    match = MAIN_JOB.search(README.read_text(encoding="utf-8"))
    assert match, "the README's main-job sentence lost its 'in **mean ± std** of LAMB's training time'"
    spread = json.loads(SEEDS.read_text())["spread"]["time_ratio_to_lamb_final"]
    assert spread["missing"] == 0, "a seed never reached LAMB's final: the README must say so, not give a mean"
    assert float(match["mean"]) == pytest.approx(spread["mean"], abs=0.0051)
    assert float(match["std"]) == pytest.approx(spread["std"], abs=0.0051)
