"""comm_volume: the formulas on a hand-computed case, mismatches reported, and a 2-rank run that matches them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.comm_volume import STEP_KINDS, compare, formulas, main


def _rank(rank: int, sent: dict[str, dict[str, int]]) -> dict[str, Any]:
    """One layer (gradient 2 x 3), A of size 3 and G of size 2, both decomposed by rank 0, MEM-OPT at world 2."""
    return {"strategy": "MEM-OPT", "symmetric": False, "grad_workers": 1,
            "factors": {"l.A": (3, False), "l.G": (2, False)}, "layers": {"l": (6, "l")},
            "inverse_worker": {"l.A": 0, "l.G": 0}, "unit_group": {"l": 0},
            "per_step": {kind: {"intercepted": dict(s), "core": dict(s)} for kind, s in sent.items()}}


def _sent(rank: int) -> dict[str, dict[str, int]]:
    grad = 24 if rank == 0 else 0  # rank 0 holds the layer and broadcasts its 6 floats to rank 1
    allreduce = 4 * (9 + 4 + 2)  # both full factors and one presence count per factor
    check = 8  # the failure-count all-reduce of every decomposition step
    return {kind: {"factor_allreduce": 0 if kind == "other" else allreduce,
                   "decomposition_broadcast": check if kind == "factor+decomp" else 0,
                   "gradient_broadcast": grad} for kind in STEP_KINDS.values()}


def test_formulas_by_hand() -> None:
    info = _rank(0, _sent(0))
    f = formulas(info, world=2, symmetric=False)
    assert f.mean == {"factor_allreduce": 60.0, "decomposition_broadcast": 8.0, "gradient_broadcast": 12.0}
    assert f.per_rank["gradient_broadcast"] == [24.0, 0.0]
    packed = formulas(info, world=2, symmetric=True)
    assert packed.mean["factor_allreduce"] == 4 * (6 + 3 + 2)  # upper triangles
    comm = formulas({**info, "grad_workers": 2}, world=2, symmetric=False)  # COMM-OPT: decompositions travel
    assert comm.mean["decomposition_broadcast"] == 4 * ((9 + 3 + 1) + (4 + 2 + 1)) / 2 + 8
    assert comm.mean["gradient_broadcast"] == 0.0
    assert comm.per_rank["decomposition_broadcast"] == [88.0, 8.0]


def test_compare_reports_every_disagreement() -> None:
    ranks = [[_rank(r, _sent(r))] for r in range(2)]
    rows, problems = compare(2, ranks)
    assert problems == [] and len(rows) == 3
    wrong = copy.deepcopy(ranks)
    wrong[1][0]["per_step"]["other"]["intercepted"]["factor_allreduce"] = 8  # factor traffic on a quiet step
    wrong[1][0]["per_step"]["other"]["core"]["factor_allreduce"] = 8
    wrong[0][0]["per_step"]["factor"]["core"]["gradient_broadcast"] = 0  # core counter disagrees with the wire
    _, problems = compare(2, wrong)
    assert any("other factor_allreduce: measured 4 B/rank, formula 0" in p for p in problems)
    assert any("ranks [1] sent [8] B" in p for p in problems)
    assert any("the core's counters say [0, 0] B, intercepted [24, 0] B" in p for p in problems)


@pytest.mark.slow  # ~14 s; default suite: planned vs measured traffic in tests/kaisa_ds/plan/test_against_measured.py
def test_two_rank_run_matches_the_formulas(tmp_path: Path) -> None:
    out = tmp_path / "comm_volume.json"
    main(["--worlds", "2", "--strategies", "MEM-OPT", "COMM-OPT", "--out", str(out)])
    data = json.loads(out.read_text())
    assert {"cpu_model", "cpu_cores", "torch", "date"} <= set(data["machine"])
    assert data["mismatches"] == []
    rows = {(r["strategy"], r["symmetric"], r["step"]): r for r in data["rows"]}
    assert len(rows) == 2 * 2 * 3
    stages = ("factor_allreduce", "decomposition_broadcast", "gradient_broadcast")
    for row in rows.values():
        for s in stages:
            assert row[f"{s} measured"] == row[f"{s} formula"]
    for strategy in ("MEM-OPT", "COMM-OPT"):
        full = rows[(strategy, False, "factor")]["factor_allreduce measured"]
        packed = rows[(strategy, True, "factor")]["factor_allreduce measured"]
        assert 0.45 < packed / full < 0.55  # the upper triangle of each factor
        assert rows[(strategy, False, "other")]["factor_allreduce measured"] == 0
    assert all(rows[("MEM-OPT", False, k)]["gradient_broadcast measured"] > 0 for k in STEP_KINDS.values())
    assert rows[("MEM-OPT", False, "factor+decomp")]["decomposition_broadcast measured"] == 8  # the failure check only
    assert all(rows[("COMM-OPT", False, k)]["gradient_broadcast measured"] == 0 for k in STEP_KINDS.values())
    assert rows[("COMM-OPT", False, "factor+decomp")]["decomposition_broadcast measured"] > 8
    assert rows[("COMM-OPT", False, "factor")]["decomposition_broadcast measured"] == 0
