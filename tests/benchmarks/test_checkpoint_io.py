"""checkpoint_io: a tiny run on real ranks shows each rank writing about 1/world of the previous format's bytes,
as the simulated assignment predicts, and a smaller save peak than the gathered state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.checkpoint_io import main


@pytest.mark.slow  # ~13 s
def test_tiny_run_shows_the_checkpoint_claims(tmp_path: Path) -> None:
    out = tmp_path / "checkpoint_io.json"
    main(["--worlds", "1", "2", "--simulated-worlds", "1", "2", "4", "--layers", "2", "--hidden", "64",
          "--intermediate", "256", "--out", str(out)])
    data = json.loads(out.read_text())
    assert {"cpu_model", "cpu_cores", "torch", "date"} <= set(data["machine"])
    sim = {r["world"]: r for r in data["simulated"]}
    assert sim[1]["new_max_over_old"] == 1.0 and sim[4]["new_max_over_old"] == pytest.approx(0.25, abs=0.05)
    measured = {r["world"]: r for r in data["measured"]}
    one, two = measured[1], measured[2]
    assert one["sharded_written_max_MB"] == pytest.approx(one["previous_written_max_MB"], rel=0.05)
    assert two["sharded_written_max_MB"] == pytest.approx(two["sharded_predicted_max_MB"], rel=0.1)  # + file format
    assert two["written_ratio"] < 0.6
