"""The README's headline table ("What ``"kfac": {"enabled": true}`` gives") says what its records say.

Each row links the record its figures come from (a ``benchmarks.convergence`` report or ``benchmarks.mission_seeds``'
``seeds.json``). A rerun rewrites the record; this test then fails until the README's figures follow, so the
headline cannot drift from the measurements behind it. Figures are compared at the two decimals the README prints.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks.convergence.analysis import spread

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
TABLE_HEADER = "| case | command, time, record | **time to LAMB's final** |"
SPREAD = re.compile(r"^(?P<mean>\d+\.\d+) ± (?P<std>\d+\.\d+)(?: \((?P<seeds>[^)]*)\))?")
REACHED = re.compile(r"^(?P<k>\d+) of (?P<n>\d+) \((?P<seeds>[^)]*)\)")
RECORD_LINK = re.compile(r"\[record\]\(([^)]+)\)")
PAGE_LINK = re.compile(r"\]\((docs/studies/[^)#]+\.md)\)")


def headline_rows() -> list[list[str]]:
    """The table's body rows, each as its cells (bold marks removed)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(TABLE_HEADER))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("**", "") for cell in line.strip().strip("|").split(" | ")])
    return rows


def per_seed(record: dict[str, Any]) -> list[dict[str, float | None]]:
    """Per seed (in seed order): K-FAC's time and steps to LAMB's final, and its time to LAMB's best (None: never)."""
    if "rows" in record:  # a benchmarks.convergence report: the library-defaults rows
        rows = sorted((r for r in record["rows"] if r.get("variant", "defaults") == "defaults"),
                      key=lambda r: r["seed"])
        return [{"final": r["to_lamb_final"]["time_ratio"], "steps": r["to_lamb_final"]["step_ratio"],
                 "best": r["to_lamb_best"]["time_ratio"]} for r in rows]
    seeds = sorted(record["seeds"], key=lambda s: s["seed"])  # benchmarks.mission_seeds
    return [{"final": s["time_ratio_to_lamb_final"], "steps": s["step_ratio_to_lamb_final"],
             "best": s["time_ratio_to_lamb_best"]} for s in seeds]


def check_spread(cell: str, values: list[float | None], *, what: str) -> None:
    """``cell`` starts "mean ± std" (and, when it lists them, each seed's value) as ``values`` give them, summarised
    as the reports summarise them (:func:`~benchmarks.convergence.analysis.spread`)."""
    match = SPREAD.match(cell)
    assert match, f"{what}: expected 'mean ± std' in {cell!r}"
    summary = spread(values)
    assert summary["missing"] == 0, f"{what}: the record has a seed that never reached it, the README a mean: {cell!r}"
    assert float(match["mean"]) == pytest.approx(summary["mean"], abs=0.0051), what
    assert float(match["std"]) == pytest.approx(summary["std"], abs=0.0051), what
    if match["seeds"]:
        listed = [float(v) for v in match["seeds"].split(", ")]
        assert listed == pytest.approx(values, abs=0.0051), f"{what}: per seed"


def check_best(cell: str, seeds: list[dict[str, float | None]], *, what: str) -> None:
    best = [s["best"] for s in seeds]
    if cell.startswith("same"):
        assert best == pytest.approx([s["final"] for s in seeds], abs=0.0051), f"{what}: best is not the final"
    else:
        check_spread_or_reached(cell, best, what=what)


def check_spread_or_reached(cell: str, values: list[float | None], *, what: str) -> None:
    """"k of n (each reaching seed's value)" where some seed never reached it, else "mean ± std"."""
    if match := REACHED.match(cell):
        reached = [float(v) for v in values if v is not None]
        assert (int(match["k"]), int(match["n"])) == (len(reached), len(values)), what
        listed = [float(v) for v in match["seeds"].split(";")[0].split(", ")]
        assert listed == pytest.approx(reached, abs=0.0051), f"{what}: per seed"
    else:
        check_spread(cell, values, what=what)


ROWS = headline_rows()


def test_the_table_has_every_case_with_a_record_and_its_page() -> None:
    assert len(ROWS) >= 7
    for cells in ROWS:
        record = RECORD_LINK.search(cells[1])
        page = PAGE_LINK.search(cells[-1])
        assert record, f"row {cells[0]!r} links no record"
        assert page and (REPO / page[1]).is_file(), f"row {cells[0]!r} links no study page"
        cited = (REPO / page[1]).read_text(encoding="utf-8")
        assert record[1].removeprefix("benchmarks/results/") in cited, f"{page[1]} does not cite {record[1]}"


@pytest.mark.parametrize("cells", ROWS, ids=[cells[0][:40] for cells in ROWS])
def test_row_matches_its_record(cells: list[str]) -> None:
    case, command, final, best, steps = cells[:5]
    link = RECORD_LINK.search(command)
    assert link, f"row {case!r} links no record"
    path = REPO / link[1]
    assert path.is_file(), f"row {case!r}: no record at {link[1]}"
    seeds = per_seed(json.loads(path.read_text()))
    assert len(seeds) == 3, f"{case}: the README's rows are 3-seed figures"
    if final.startswith("—"):  # a case where LAMB's final means nothing (every curve rises late)
        assert steps.startswith("—"), case
    else:
        check_spread_or_reached(final, [s["final"] for s in seeds], what=f"{case}: time to LAMB's final")
        check_spread_or_reached(steps, [s["steps"] for s in seeds], what=f"{case}: LAMB's steps")
    check_best(best, seeds, what=f"{case}: time to LAMB's best")
