"""memory: a tiny run shows K-FAC memory flat in accumulation passes, half-size FP16/BF16 factors, and
decompositions split across ranks by MEM-OPT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.memory import main


def test_tiny_run_shows_the_memory_claims(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    main(["--size", "tiny", "--vocab", "200", "--batch", "2", "--seq", "16", "--passes", "1", "4",
          "--dtypes", "fp32", "fp16", "bf16", "--inv-dtypes", "fp32", "--worlds", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    assert {"cpu_model", "cpu_cores", "torch", "date"} <= set(data["machine"])
    single = [r for r in data["rows"] if r["world"] == 1]
    assert sorted((r["factor_dtype"], r["passes"]) for r in single) == sorted(
        (d, n) for d in ("fp32", "fp16", "bf16") for n in (1, 4))
    by = {(r["factor_dtype"], r["passes"]): r for r in single}
    for dtype in ("fp32", "fp16", "bf16"):  # flat in the number of accumulation passes
        for key in ("factors_stored_MB", "window_buffer_MB"):
            assert by[(dtype, 1)][key] == by[(dtype, 4)][key] > 0, (dtype, key)
    for dtype in ("fp32", "fp16", "bf16"):  # FP16 too: scaled storage keeps G factors below FP16's normal range
        assert by[(dtype, 1)]["kfac_MB_per_rank_max"] == by[(dtype, 4)]["kfac_MB_per_rank_max"]
        assert by[(dtype, 1)]["all_zero_factors"] == by[(dtype, 1)]["missing_decompositions"] == 0
    fp32 = by[("fp32", 1)]
    for half in ("fp16", "bf16"):
        assert by[(half, 1)]["factors_stored_MB"] == pytest.approx(fp32["factors_stored_MB"] / 2, rel=1e-9)
        # the half-precision window is the packed upper triangle in the storage dtype: ~1/4 of the FP32 n×n window
        assert by[(half, 1)]["window_buffer_MB"] < 0.3 * fp32["window_buffer_MB"]
        assert by[(half, 1)]["kfac_MB_per_rank_max"] < fp32["kfac_MB_per_rank_max"]
    assert fp32["window_buffer_MB"] == pytest.approx(fp32["factors_stored_MB"], rel=1e-9)
    assert fp32["decompositions_MB_max"] == pytest.approx(fp32["decompositions_all_MB"], rel=1e-9)
    assert data["summary"]["stored_factor_ratio_to_fp32"]["fp16/fp32"] == pytest.approx(0.5)
    assert all(r["peak_source"] == "ru_maxrss" and r["peak_delta_MB_max"] >= 0 for r in data["rows"])

    dist_rows = {r["strategy"]: r for r in data["rows"] if r["world"] == 2}
    assert set(dist_rows) == {"MEM-OPT", "COMM-OPT"}
    mem, comm = dist_rows["MEM-OPT"], dist_rows["COMM-OPT"]
    assert mem["factors_stored_MB"] == comm["factors_stored_MB"] == fp32["factors_stored_MB"]  # factors everywhere
    assert comm["decompositions_MB_max"] == pytest.approx(comm["decompositions_all_MB"], rel=1e-9)
    assert mem["decompositions_MB_mean"] * 2 == pytest.approx(mem["decompositions_all_MB"], rel=1e-9)
    assert mem["decompositions_MB_max"] < comm["decompositions_MB_max"]
