"""benchmarks.strategy_cost: the variants it trains, the figures it reads from the metrics, and a real run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.strategy_cost import LAMB, MISSION_CONFIG, main, run_figures, summarise, variant_config


def test_variants_are_lamb_and_the_same_kfac_under_each_strategy() -> None:
    base = json.loads(MISSION_CONFIG.read_text())
    assert "kfac" not in variant_config(base, None)
    mem = variant_config(base, "mem-opt")
    assert mem["kfac"] == {**base["kfac"], "grad_worker_fraction": "mem-opt"}
    assert {k: v for k, v in mem.items() if k != "kfac"} == variant_config(base, None)
    with pytest.raises(ValueError, match="enabled kfac section"):
        variant_config(variant_config(base, None), "comm-opt")


def _rows(seconds: list[float], *, loss: float, stages: dict[str, float] | None = None) -> list[dict[str, Any]]:
    return [{"step": i + 1, "seq_per_s": 32 / s, "loss": loss, **({"kfac_ms": stages} if stages else {})}
            for i, s in enumerate(seconds)]


def test_figures_skip_the_warmup_and_ratios_pair_each_round_with_its_own_lamb() -> None:
    """The cost is the mean step: K-FAC's one factor step in five is its overhead, which a median would skip."""
    lamb = run_figures(_rows([9.0, 0.10, 0.10, 0.10, 0.10, 0.10], loss=3.0), skip=1, batch=32)
    assert lamb["step_s_mean"] == pytest.approx(0.10) and lamb["steps_timed"] == 5
    slow_lamb = {**lamb, "step_s_mean": 0.2}
    comm = run_figures(_rows([9.0, 0.35, 0.10, 0.10, 0.10, 0.10], loss=2.5, stages={"preconditioning": 20.0}),
                       skip=1, batch=32)
    assert comm["step_s_median"] == pytest.approx(0.10) and comm["step_s_mean"] == pytest.approx(0.15)
    mem = run_figures(_rows([9.0, 0.12, 0.13, 0.12], loss=2.5, stages={"preconditioning": 10.0}), skip=1, batch=32)
    s = summarise([{LAMB: lamb, "comm-opt": comm, "mem-opt": mem}, {LAMB: slow_lamb, "comm-opt": comm, "mem-opt": mem}])
    assert s["comm-opt"]["ratios"] == pytest.approx([1.5, 0.75])  # each round against its own LAMB
    assert s["mem-opt"]["kfac_ms"] == {"preconditioning": 10.0} and s["strategies_agree"]
    drifted = {**mem, "final_loss": 2.6}
    assert not summarise([{LAMB: lamb, "comm-opt": comm, "mem-opt": drifted}])["strategies_agree"]
    with pytest.raises(ValueError, match="--skip"):
        run_figures(_rows([0.1], loss=1.0), skip=1, batch=32)


@pytest.mark.slow  # ~2 min: three 2-rank launches
def test_a_short_run_trains_every_variant_with_the_same_losses(tmp_path: Path) -> None:
    res = main(["--steps", "12", "--skip", "2", "--rounds", "1", "--work", str(tmp_path / "w"),
                "--out", str(tmp_path / "out.json")])
    s = res["summary"]
    assert s["strategies_agree"]
    assert s["mem-opt"]["kfac_ms"]["gradient_broadcast"] > 10 * s["comm-opt"]["kfac_ms"]["gradient_broadcast"]
    assert not s[LAMB]["kfac_ms"] and json.loads((tmp_path / "out.json").read_text())["rounds"]
