"""The README's headline (the per-batch tables of the scaling study, BERT-tiny's and BERT-mini's, and the main job's
sentence) says what its records say.

A rerun rewrites ``benchmarks/results/convergence/scaling[_mini]/summary_max_factor_ratio2.json`` or the main job's
``seeds.json``; this test then fails until the README's figures follow, so the headline cannot drift from the
measurements behind it.
Figures are compared at the decimals the README prints.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
RESULTS = REPO / "benchmarks/results/convergence"
# the records of today's defaults: one-sided rotation's reruns, run before it became the default, so they name the
# key (``_max_factor_ratio2``, ``_one_sided``); batch_scaling.md, "The answer today"
SEEDS = REPO / "benchmarks/results/mission/seeds_batch8192_one_sided/seeds.json"
COLUMNS = " | K-FAC's time to LAMB's final loss, × LAMB's |"
# each per-batch table of the README (by the first cell of its header) and the study summary it must follow
TINY, MINI = "| tokens a step", "| BERT-mini, tokens a step"
TABLES = {TINY: RESULTS / "scaling/summary_max_factor_ratio2.json",
          MINI: RESULTS / "scaling_mini/summary_max_factor_ratio2.json"}
SPREAD = re.compile(r"^(?P<mean>\d+\.\d+)(?: ± (?P<std>\d+\.\d+))?$")
REACHED = re.compile(r"^(?P<k>\d+) of (?P<n>\d+)$")
NEVER = "never"  # the time cell of a batch where no seed reached LAMB's final loss
MAIN_JOB = re.compile(r"in \*\*(?P<mean>\d+\.\d+) ± (?P<std>\d+\.\d+)\*\* of LAMB's training time")


def table_rows(first_header_cell: str) -> list[list[str]]:
    """A per-batch table's body rows, each as its cells (bold marks removed); none when the README lacks it (the
    coverage tests then fail, naming the batches it must show)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(first_header_cell + COLUMNS)]
    rows: list[list[str]] = []
    for line in lines[starts[0] + 2:] if starts else []:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("**", "") for cell in line.strip().strip("|").split(" | ")])
    return rows


ROWS = [(header, cells) for header in TABLES for cells in table_rows(header)]


def batch_of(cells: list[str]) -> str:
    match = re.match(r"^([\d,]+)", cells[0])
    assert match, f"row {cells[0]!r} does not start with its batch"
    return match[1].replace(",", "")


def test_bert_tiny_s_table_covers_every_batch_of_the_study() -> None:
    plan = json.loads((TABLES[TINY].parent / "plan.json").read_text())
    assert [batch_of(cells) for cells in table_rows(TINY)] == [str(b) for b in plan["batches"]]


def test_bert_mini_s_table_covers_every_batch_it_has_pairs_at() -> None:
    """BERT-mini runs a subset of the plan's batches (amendment 5): the table has a row for each one the summary has."""
    per_batch = json.loads(TABLES[MINI].read_text())["per_batch"]
    assert [batch_of(cells) for cells in table_rows(MINI)] == sorted(per_batch, key=int)


@pytest.mark.parametrize(("header", "cells"), ROWS, ids=[f"{h[2:8]}-{c[0][:20]}" for h, c in ROWS])
def test_row_matches_the_fit(header: str, cells: list[str]) -> None:
    per_batch: dict[str, Any] = json.loads(TABLES[header].read_text())["per_batch"]
    tokens = batch_of(cells)
    if "not rerun" in cells[1]:
        assert tokens not in per_batch, f"{tokens}: the summary has it now; the README must say what it found"
        return
    versus = per_batch[tokens]["kfac_to_lamb_final"]
    time, steps, reached, overhead = cells[1:5]
    n = versus["time_ratio"]["n"]
    k_of_n = REACHED.match(reached)
    assert k_of_n, f"{tokens}: expected 'k of n' in {reached!r}"
    assert (int(k_of_n["k"]), int(k_of_n["n"])) == (n, n + versus["time_ratio"]["missing"]), tokens
    if n == 0:
        assert time == steps == NEVER, f"{tokens}: no seed reached LAMB's final; the cells must say {NEVER!r}"
    else:
        match = SPREAD.match(time)
        assert match, f"{tokens}: expected 'mean ± std' (or one value, for one seed) in {time!r}"
        assert float(match["mean"]) == pytest.approx(versus["time_ratio"]["mean"], abs=0.0051), tokens
        assert (match["std"] is None) == (n == 1), f"{tokens}: a spread needs two seeds; {n} reached it"
        if match["std"] is not None:
            assert float(match["std"]) == pytest.approx(versus["time_ratio"]["std"], abs=0.0051), tokens
        assert float(steps) == pytest.approx(versus["step_ratio"]["mean"], abs=0.0051), tokens
    overhead_percent = float(overhead.rstrip("%").replace("−", "-"))  # a negative overhead: timing noise
    assert overhead_percent == pytest.approx(100 * per_batch[tokens]["kfac_step_overhead"], abs=0.051)


def test_the_main_job_sentence_matches_its_seeds() -> None:
    match = MAIN_JOB.search(README.read_text(encoding="utf-8"))
    assert match, "the README's main-job sentence lost its 'in **mean ± std** of LAMB's training time'"
    spread = json.loads(SEEDS.read_text())["spread"]["time_ratio_to_lamb_final"]
    assert spread["missing"] == 0, "a seed never reached LAMB's final: the README must say so, not give a mean"
    assert float(match["mean"]) == pytest.approx(spread["mean"], abs=0.0051)
    assert float(match["std"]) == pytest.approx(spread["std"], abs=0.0051)
