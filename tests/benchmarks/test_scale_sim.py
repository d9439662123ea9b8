"""scale_sim: the real assignment at simulated world sizes; the balance target at BERT-Large shapes."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.scale_sim import main
from kaisa_ds.config import KFACConfig
from kaisa_ds.plan.bert_sizes import KAISA_SKIP
from kaisa_ds.plan.shapes import model_shapes
from kaisa_ds.plan.summary import make_plan


def test_small_worlds_every_strategy(tmp_path: Path) -> None:
    out = tmp_path / "scale_sim.json"
    main(["--size", "tiny", "--worlds", "4", "8", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {(r["world"], r["strategy"]) for r in rows} == {(w, s) for w in (4, 8)
                                                           for s in ("MEM-OPT", "HYBRID-OPT", "COMM-OPT")}
    by = {(r["world"], r["strategy"]): r for r in rows}
    for r in rows:
        assert r["imbalance"] >= r["bound"] - 1e-9  # no assignment beats the bound
    for w in (4, 8):  # decompositions per rank shrink from COMM-OPT to MEM-OPT; gradients travel the other way
        assert by[(w, "MEM-OPT")]["decompositions_MB_max"] < by[(w, "HYBRID-OPT")]["decompositions_MB_max"] \
            < by[(w, "COMM-OPT")]["decompositions_MB_max"]
        assert by[(w, "COMM-OPT")]["plain_step_MB_max"] == 0 < by[(w, "MEM-OPT")]["plain_step_MB_max"]


def test_hybrid_opt_at_64_ranks_is_within_10_percent_of_its_bound() -> None:
    # both sides rotated (max_factor_ratio None): the MLP's 4096-wide factors are what HYBRID-OPT must balance
    config = KFACConfig(grad_worker_fraction="hybrid-opt", skip_layers=KAISA_SKIP, max_factor_ratio=None)
    shapes, _ = model_shapes("large", config, seq=128)
    plan = make_plan(shapes, config, world=64, micro_batch=64, seq=128)
    assert 1.2 < plan["decomposition_imbalance_bound"] < 1.3  # one 4096-wide factor outweighs a rank's mean share
    assert plan["decomposition_imbalance"] <= 1.1 * plan["decomposition_imbalance_bound"]
