"""python -m kaisa_ds.plan: BERT-Large without weights, the JSON keys, config precedence and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kaisa_ds.plan.cli import main


def test_bert_large_plans_from_flags_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--model", "large", "--world", "64", "--micro-batch", "64", "--seq", "128", "--grad-worker-fraction",
          "0.5", "--factor-dtype", "fp16", "--json", "--gemm-gflops", "100000", "--eigh-seconds", "1024=0.02",
          "4096=0.5", "--factor-update-steps", "5", "--inv-update-steps", "50", "--compute-method", "eigen",
          "--max-factor-ratio", "none"])  # both sides rotated: the MLP's 4096-wide factors are decomposed
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


def test_the_default_strategy_is_planned_for_the_ranks_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    """``grad_worker_fraction`` left at ``auto`` is COMM-OPT on GPUs and MEM-OPT on CPU ranks: the plan says which it
    planned, by name, and the memory follows."""
    main(["--model", "tiny", "--world", "4", "--json"])
    gpus = json.loads(capsys.readouterr().out)
    main(["--model", "tiny", "--world", "4", "--json", "--cpu-ranks"])
    cpus = json.loads(capsys.readouterr().out)
    assert (gpus["strategy"], cpus["strategy"]) == ("COMM-OPT", "MEM-OPT")
    assert gpus["kfac"]["grad_worker_fraction"] == cpus["kfac"]["grad_worker_fraction"] == "auto"
    assert cpus["memory_bytes_per_rank"] < gpus["memory_bytes_per_rank"]



def test_the_default_inv_dtype_is_planned_for_the_ranks_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    """``inv_dtype`` left at ``auto`` is BF16 on GPUs and FP32 on CPU ranks: the plan names the dtype it planned and
    its decompositions take half the bytes on GPUs."""
    common = ["--model", "mini", "--world", "2", "--grad-worker-fraction", "comm-opt", "--json"]
    main(common)
    gpus = json.loads(capsys.readouterr().out)
    main([*common, "--cpu-ranks"])
    cpus = json.loads(capsys.readouterr().out)
    assert (gpus["kfac"]["inv_dtype"], cpus["kfac"]["inv_dtype"]) == ("auto: torch.bfloat16", "auto: torch.float32")
    decs = [p["memory_bytes"]["max_rank"]["decompositions"] for p in (gpus, cpus)]
    assert decs[0] * 2 == decs[1] > 0

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
    def statistics(*extra: str) -> float:
        main([*flags, *extra])
        return float(json.loads(capsys.readouterr().out)["overhead"]["seconds_per_step_kind"]["decomposition"]
                     ["statistics"])

    uncapped = ["--max-statistic-rows", str(10**9)]
    full, quarter = statistics(*uncapped), statistics(*uncapped, "--factor-pass-fraction", "0.25")
    assert quarter == pytest.approx(full / 4)  # 1 of the 4 passes
    # 8 ranks x 4 passes x 4,096 tokens: the default cap binds either way, so the statistics cost what the cap lets in
    capped = statistics()
    assert capped == pytest.approx(statistics("--factor-pass-fraction", "0.25")) and capped < quarter


EXAMPLE_CONFIG = Path(__file__).resolve().parents[3] / "examples" / "ds_config_kfac.json"  # HF "auto" batch keys


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().err


def test_hf_auto_batch_keys_take_the_flags_or_name_them(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", "tiny", "--world", "2", "--ds-config", str(EXAMPLE_CONFIG), "--json"]
    err = _error(base, capsys)
    assert "train_micro_batch_size_per_gpu" in err and "--micro-batch" in err and "auto" in err
    err = _error([*base, "--micro-batch", "8"], capsys)
    assert "gradient_accumulation_steps" in err and "--passes" in err
    main([*base, "--micro-batch", "8", "--passes", "2"])
    plan = json.loads(capsys.readouterr().out)
    assert (plan["micro_batch"], plan["passes"], plan["inv_update_steps"]) == (8, 2, 5)  # 5: the JSON's kfac section


def test_batch_sizes_that_deepspeed_would_refuse_are_refused(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
                               "train_batch_size": 64, "kfac": {}}))
    err = _error(["--model", "tiny", "--world", "2", "--ds-config", str(cfg)], capsys)  # 8 x 2 x 2 = 32, not 64
    assert "train_batch_size" in err and "64" in err and "32" in err
    cfg.write_text(json.dumps({"train_batch_size": 64, "kfac": {}}))
    err = _error(["--model", "tiny", "--world", "4", "--ds-config", str(cfg), "--micro-batch", "24"], capsys)
    assert "train_batch_size" in err and "--micro-batch" in err  # 64 is no multiple of 24 x 4
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": "8", "kfac": {}}))
    err = _error(["--model", "tiny", "--world", "4", "--ds-config", str(cfg)], capsys)
    assert "train_micro_batch_size_per_gpu" in err


def test_options_the_plan_would_ignore_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 1000, "hidden_size": 32,
                                                      "num_hidden_layers": 1, "num_attention_heads": 2,
                                                      "intermediate_size": 64, "max_position_embeddings": 128}))
    err = _error(["--model", str(tmp_path), "--world", "2", "--vocab", "30522"], capsys)
    assert "--vocab" in err and "1000" in err  # the folder's config.json decides the vocabulary
    err = _error(["--model", str(tmp_path), "--world", "2", "--seq", "256"], capsys)
    assert "--seq" in err and "max_position_embeddings" in err
    err = _error(["--model", "tiny", "--world", "2", "--eigh-seconds", "128=0.001", "--network-gbps", "100"], capsys)
    assert "--gemm-gflops" in err and "--eigh-seconds" in err and "--network-gbps" in err
    err = _error(["--model", "tiny", "--world", "2", "--gemm-gflops", "100", "--eigh-seconds", "128=0.001",
                  "--inverse-seconds", "128=0.001"], capsys)
    assert "--inverse-seconds" in err and "compute_method" in err


def test_ds_config_the_engine_refuses_or_runs_without_kfac(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 3},
                               "kfac": {"enabled": True}}))
    assert "zero_optimization.stage" in _error(["--model", "tiny", "--world", "2", "--ds-config", str(cfg)], capsys)
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "kfac": {"enabled": True, "lr": 0.1}}))
    assert "kfac.lr" in _error(["--model", "tiny", "--world", "2", "--ds-config", str(cfg)], capsys)
    for section in ({"kfac": {"enabled": False}}, {}):
        cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, **section}))
        caplog.clear()
        main(["--model", "tiny", "--world", "2", "--ds-config", str(cfg), "--json"])
        assert "K-FAC is off" in caplog.text, section


def test_a_calibrated_step_of_other_settings_is_not_the_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    cal = tmp_path / "step_cost.json"
    cal.write_text(json.dumps({"calibration": {"gemm_gflops": 50, "eigh_seconds": {"128": 0.001},
                                               "baseline_step_s": 0.5,
                                               "settings": {"model": "tiny", "micro_batch": 8, "seq": 128}}}))
    flags = ["--model", "tiny", "--world", "2", "--micro-batch", "8", "--calibration", str(cal), "--json"]
    main(flags)
    assert json.loads(capsys.readouterr().out)["overhead"]["baseline_step_seconds"] == 0.5  # its own settings
    main([*flags, "--passes", "4"])  # step_cost times one pass: four are not that step
    o = json.loads(capsys.readouterr().out)["overhead"]
    assert o["baseline_step_seconds"] != 0.5 and o["baseline_source"].startswith("estimated")
    assert "--step-seconds" in caplog.text


def test_a_calibrated_step_of_accumulated_passes_is_the_baseline_at_those_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = tmp_path / "step_cost.json"
    cal.write_text(json.dumps({"calibration": {"gemm_gflops": 50, "eigh_seconds": {"128": 0.001},
                                               "baseline_step_s": 2.0, "passes": 4,
                                               "settings": {"model": "tiny", "micro_batch": 8, "seq": 128}}}))
    flags = ["--model", "tiny", "--world", "2", "--micro-batch", "8", "--calibration", str(cal), "--json"]
    main([*flags, "--passes", "4"])  # step_cost --accumulation 4 timed steps of four passes
    assert json.loads(capsys.readouterr().out)["overhead"]["baseline_step_seconds"] == 2.0
    main(flags)
    assert json.loads(capsys.readouterr().out)["overhead"]["baseline_step_seconds"] != 2.0


@pytest.mark.parametrize(("flags", "rows", "every"), [
    (["--micro-batch", "16", "--seq", "64"], 2048, 50),  # the small regime: 16 × 64 × 2 ranks
    (["--micro-batch", "32", "--seq", "32", "--passes", "4"], 8192, 10),  # the large one: 4 accumulated passes
    (["--micro-batch", "3", "--seq", "7", "--factor-sample-fraction", "0.5"], 22, 50),  # ceil(10.5) a pass, as sampled
])
def test_the_auto_interval_is_resolved_from_the_plans_batch(flags: list[str], rows: int, every: int,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    main(["--model", "tiny", "--world", "2", "--json", *flags])
    plan = json.loads(capsys.readouterr().out)
    assert (plan["statistic_rows"], plan["inv_update_steps"], plan["inv_update_steps_auto"]) == (rows, every, True)
    assert plan["traffic"]["period_steps"] == every
    main(["--model", "tiny", "--world", "2", *flags])
    assert f"decompositions every {every} steps (auto: {rows} statistic rows per update;" in capsys.readouterr().out
    main(["--model", "tiny", "--world", "2", "--json", "--inv-update-steps", "7", *flags])
    assert json.loads(capsys.readouterr().out)["inv_update_steps"] == 7


def test_a_word_other_than_auto_for_the_interval_is_refused_by_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--world", "2", "--inv-update-steps", "often"])
    assert "--inv-update-steps" in capsys.readouterr().err


def test_any_transformers_model_plans_from_its_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GPT-2's Conv1D (weight stored (in, out)) and Llama's grouped-query attention (a key and value narrower than
    the query, all reading one input) in the planner's shapes, with the coverage the run would log."""
    from transformers import GPT2Config, LlamaConfig

    GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=1000).save_pretrained(tmp_path / "gpt2")
    LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=20000).save_pretrained(tmp_path / "llama")
    main(["--model", str(tmp_path / "gpt2"), "--world", "2", "--json"])
    gpt2 = json.loads(capsys.readouterr().out)
    assert gpt2["model_type"] == "gpt2" and gpt2["layers"] == 2 * 4 + 1  # c_attn, c_proj, c_fc, mlp.c_proj; wpe
    assert gpt2["coverage"]["by_type"]["Conv1D"] == {"preconditioned": 2 * (64 * 192 + 192 + 64 * 64 + 64 + 2 * (
        64 * 256) + 256 + 64)}
    assert gpt2["coverage"]["linear_share"] == 1.0  # the LM head is tied to wte: out of both sides
    main(["--model", str(tmp_path / "llama"), "--world", "2", "--json"])
    llama = json.loads(capsys.readouterr().out)
    assert llama["layers"] == 2 * 7 + 2 and llama["factors"] == 2 * (7 + 4) + 4  # q/k/v share an A, gate/up too
    assert llama["coverage"]["linear_share"] == 1.0 and llama["coverage"]["share"] > 0.99  # all but the norms
    assert any("G 20,000 > max_factor_dim" in note for note in llama["coverage"]["notes"])  # the untied LM head
    main(["--model", str(tmp_path / "llama"), "--world", "2"])
    text = capsys.readouterr().out
    assert text.startswith("K-FAC plan: llama") and "coverage: " in text


def test_the_plan_predicts_the_cost_rules_interval_from_the_rates(capsys: pytest.CaptureFixture[str]) -> None:
    """With eigh timings and a baseline step, the planner sets ``"auto"`` as the run would: decompositions at most
    1.5% of a step. BERT-mini's round on one rank, both sides rotated: 8 factors of 256/257 and 4 of 1024/1025 at
    the given timings."""
    common = ["--model", "mini", "--world", "1", "--micro-batch", "64", "--seq", "128", "--json", "--max-factor-ratio",
              "none", "--gemm-gflops", "50", "--eigh-seconds", "256=0.01", "1024=0.2"]
    main([*common, "--step-seconds", "2.0"])
    slow_step = json.loads(capsys.readouterr().out)
    main([*common, "--step-seconds", "200.0"])
    fast_rounds = json.loads(capsys.readouterr().out)
    rules = slow_step["inv_update_steps_cost_rule"], fast_rounds["inv_update_steps_cost_rule"]
    assert slow_step["inv_update_steps"] == rules[0] > 10  # a round of ~1 s against 2 s steps: the cost rule wins
    assert rules[1] == 5 and fast_rounds["inv_update_steps"] == 10  # negligible rounds: the rows rule's 10
    main(["--model", "mini", "--world", "1", "--json"])
    assert json.loads(capsys.readouterr().out)["inv_update_steps_cost_rule"] is None  # no rates: not predicted


def test_the_default_plan_decomposes_no_mlp_wide_side(capsys: pytest.CaptureFixture[str]) -> None:
    """One-sided rotation (the default ``max_factor_ratio`` 2) keeps BERT-Large's 4096-wide MLP sides diagonal: no
    rank then holds a factor that outweighs its share, and each rank holds less than with both sides rotated."""
    common = ["--model", "large", "--world", "64", "--micro-batch", "64", "--seq", "128", "--json",
              "--grad-worker-fraction", "hybrid-opt"]
    main(common)
    one_sided = json.loads(capsys.readouterr().out)
    main([*common, "--max-factor-ratio", "none"])
    both = json.loads(capsys.readouterr().out)
    assert both["decomposition_imbalance_bound"] > 1.2 and one_sided["decomposition_imbalance_bound"] < 1.1
    assert one_sided["memory_bytes_per_rank"] < both["memory_bytes_per_rank"]


def test_a_bad_max_factor_ratio_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--world", "1", "--max-factor-ratio", "wide"])
    err = capsys.readouterr().err
    assert "--max-factor-ratio" in err and "'wide' is neither a number nor 'none'" in err
