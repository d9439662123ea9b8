"""python -m kaisa_ds.plan: BERT-Large without weights, the JSON keys, config precedence and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kaisa_ds.plan.cli import main


def test_bert_large_plans_from_flags_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--model", "large", "--world", "64", "--micro-batch", "64", "--seq", "128", "--grad-worker-fraction",
          "0.5", "--factor-dtype", "fp16", "--json", "--gemm-gflops", "100000", "--eigh-seconds", "1024=0.02",
          "4096=0.5", "--factor-update-steps", "5", "--inv-update-steps", "50"])
    plan = json.loads(capsys.readouterr().out)
    assert plan["layers"] == 24 * 6 and plan["factors"] == 24 * 10  # q/k/v share one A factor per layer
    assert plan["grad_workers"] == 32 and plan["strategy"] == "HYBRID-OPT"
    parts = plan["memory_bytes"]["max_rank"]
    assert plan["memory_bytes_per_rank"] == sum(parts.values())
    # fp16 factors: the window is their packed upper triangle in fp16, about half the n×n stored factors
    assert parts["window"] == pytest.approx(parts["factors"] / 2, rel=2e-3) and parts["window"] > parts["factors"] / 2
    assert plan["decomposition_imbalance"] >= plan["decomposition_imbalance_bound"] > 1
    assert plan["traffic"]["step_counts"] == {"plain": 40, "factor": 9, "decomposition": 1}
    o = plan["overhead"]
    assert o["seconds_per_step_kind"]["decomposition"]["decomposition"] > o["seconds_per_step_kind"]["plain"]["total"]
    assert o["amortised_overhead"] > 0


def test_ds_config_section_and_flags_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "train_batch_size": 64,
                               "kfac": {"enabled": True, "grad_worker_fraction": 1.0, "factor_dtype": "bf16"}}))
    main(["--model", "tiny", "--ds-config", str(cfg), "--world", "4", "--json"])
    base = json.loads(capsys.readouterr().out)
    assert (base["micro_batch"], base["passes"], base["strategy"]) == (8, 2, "COMM-OPT")
    main(["--model", "tiny", "--ds-config", str(cfg), "--world", "4", "--json", "--grad-worker-fraction", "mem-opt"])
    mem = json.loads(capsys.readouterr().out)
    assert mem["strategy"] == "MEM-OPT" and mem["kfac"]["factor_dtype"] == "torch.bfloat16"
    assert mem["memory_bytes_per_rank"] < base["memory_bytes_per_rank"]


def test_bad_input_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--world", "4", "--factor-dtype", "int8"])
    assert "factor_dtype" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--world", "6", "--grad-worker-fraction", "0.25"])
    assert "grad_worker_fraction" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path), "--world", "2"])
    assert "config.json" in capsys.readouterr().err


def test_pass_fraction_cuts_the_predicted_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--model", "mini", "--world", "8", "--micro-batch", "32", "--seq", "128", "--passes", "4", "--json",
             "--gemm-gflops", "1000", "--eigh-seconds", "256=0.001", "1024=0.01"]
    runs = {}
    for fraction in ("1", "0.25"):
        main([*flags, "--factor-pass-fraction", fraction])
        runs[fraction] = json.loads(capsys.readouterr().out)
    assert runs["0.25"]["kfac"]["factor_pass_fraction"] == 0.25
    stats = {f: r["overhead"]["seconds_per_step_kind"]["decomposition"]["statistics"] for f, r in runs.items()}
    assert stats["0.25"] == pytest.approx(stats["1"] / 4)  # 1 of the 4 passes
