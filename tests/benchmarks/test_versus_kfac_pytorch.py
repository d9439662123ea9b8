"""versus_kfac_pytorch: argument checks, the amortisation and ratio arithmetic, the message when kfac-pytorch is
missing (always); a tiny end-to-end run against kfac-pytorch only where it is importable (never in CI)."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.harness.interval import Interval, amortise
from benchmarks.harness.models import bert_for_pretraining
from benchmarks.harness.timing import median
from benchmarks.versus_kfac_pytorch.cli import main, parse_args
from benchmarks.versus_kfac_pytorch.kfac_pytorch import import_kfac
from benchmarks.versus_kfac_pytorch.measure import compare, speedup, summarise
from benchmarks.versus_kfac_pytorch.settings import COMPONENTS, LIBRARIES
from kaisa_ds.plan.bert_sizes import KAISA_SKIP


@pytest.mark.parametrize("argv", [
    ["--factor-every", "5", "--inv-every", "7"],  # not a multiple
    ["--factor-every", "0"],
    ["--repeats", "0"],
    ["--warmup", "-1"],
    ["--batch", "0"],
    ["--seq", "1"],
    ["--threads", "0"],
    ["--size", "huge"],
])
def test_bad_arguments_exit_before_anything_is_built(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2  # argparse's usage error, not the missing-kfac-pytorch exit


def test_defaults_are_issue_9s_settings() -> None:
    args = parse_args([])
    assert (args.size, args.batch, args.seq, args.factor_every, args.inv_every) == ("mini", 32, 128, 5, 50)


def test_kaisa_ds_takes_k_fac_s_own_clipped_step_as_kfac_pytorch_does() -> None:
    """kfac-pytorch has no grafting: when kaisa_ds's default became the grafted step (2026-11-28), this comparison
    silently set one library's step at the raw gradient's size, and its agreement figures compared two steps."""
    from benchmarks.versus_kfac_pytorch.runners import kaisa_runner
    from kaisa_ds.enums import Grafting

    config = kaisa_runner(bert_for_pretraining("tiny", vocab=300, seq=16), factor_every=2, inv_every=4, lr=1e-3,
                          cuda=False).precond.config
    assert config.grafting is Grafting.NONE
    assert config.value("kl_clip", 0) == pytest.approx(0.001)


def _kind(hook: float, step: float, capture: float, **stages: float) -> dict[str, float]:
    """A made-up summarised kind: hook_extra split into statistics and machinery, precond.step() into stages."""
    row = {"factor_capture": capture, "hook_machinery": hook - capture, "hook_extra": hook,
           "decomposition": 0.0, "preconditioning": 0.0, "kl_clip": 0.0, "write_grads": 0.0, **stages}
    row["step_other"] = step - sum(row[s] for s in ("decomposition", "preconditioning", "kl_clip", "write_grads"))
    row["kfac_total"] = hook + step
    return row


def test_amortise_weights_each_kind_by_its_count_and_the_ratio_is_kfp_over_kaisa() -> None:
    interval = Interval(5, 50)  # 1 decomposition, 9 factor, 40 plain steps
    kaisa = {"decomposition": _kind(1.0, 4.0, 0.8, decomposition=3.5, preconditioning=0.1),
             "factor": _kind(1.0, 0.5, 0.8, preconditioning=0.1),
             "plain": _kind(0.0, 0.1, 0.0, preconditioning=0.1)}
    kfp = {"decomposition": _kind(2.0, 8.0, 1.5, decomposition=7.0, preconditioning=0.2),
           "factor": _kind(2.0, 1.0, 1.5, preconditioning=0.2),
           "plain": _kind(0.1, 0.2, 0.0, preconditioning=0.2)}
    am = amortise(kaisa, interval, components=COMPONENTS)
    assert am["counts"] == {"decomposition": 1, "factor": 9, "plain": 40}
    assert am["seconds_per_step"] == pytest.approx((5.0 + 9 * 1.5 + 40 * 0.1) / 50)  # 0.45 s
    per = am["components_seconds_per_step"]
    assert per["decomposition"] == pytest.approx(3.5 / 50)
    assert per["preconditioning"] == pytest.approx(0.1)
    assert per["factor_capture"] == pytest.approx(10 * 0.8 / 50)
    assert sum(per[c] for c in COMPONENTS) == pytest.approx(am["seconds_per_step"])  # the components add up
    # kfac-pytorch: (10 + 9 * 3 + 40 * 0.3) / 50 = 0.98 s/step, 0.98 / 0.45 = 2.178 times kaisa_ds
    assert amortise(kfp, interval, components=COMPONENTS)["seconds_per_step"] == pytest.approx(0.98)
    summary = {"baseline_fwd_bwd": 2.0, "kaisa_ds": kaisa, "kfac-pytorch": kfp}
    cmp = compare(summary, interval)
    assert cmp["ratio_kfp_over_kaisa"] == pytest.approx(0.98 / 0.45)
    assert cmp["overhead_of_fwd_bwd"]["kaisa_ds"] == pytest.approx(0.45 / 2.0)
    assert cmp["ratio_per_kind"]["plain"] == pytest.approx(3.0)
    assert speedup(kfp_seconds=1.0, kaisa_seconds=2.0) == 0.5
    # noise made a time negative: no ratio rather than a wrong one
    assert math.isnan(speedup(kfp_seconds=1.0, kaisa_seconds=-0.1))


def test_summarise_pairs_each_forward_backward_with_the_baseline_run_just_before_it() -> None:
    def lib(base: float, hooks: float, step: float) -> dict[str, float]:
        return {"baseline_fwd_bwd": base, "fwd_bwd": base + hooks, "precond_step": step, "factor_capture": 0.2,
                "decomposition": 0.0, "preconditioning": 0.1, "kl_clip": 0.0, "write_grads": 0.0}

    # load drifts: the baseline takes 1, 3, 2 s in turn; the hooks always add 0.5 s (kaisa_ds) and 1.0 s
    rounds = [{"plain": {"kaisa_ds": lib(b, 0.5, 0.3), "kfac-pytorch": lib(b + 0.1, 1.0, 0.4)}}
              for b in (1.0, 3.0, 2.0)]
    med = summarise(rounds, median, paired=True)
    assert med["baseline_fwd_bwd"] == pytest.approx(2.05)  # over both libraries' baselines
    kaisa = med["kaisa_ds"]["plain"]
    assert kaisa["hook_extra"] == pytest.approx(0.5)
    assert kaisa["hook_machinery"] == pytest.approx(0.3)  # hook_extra minus the statistics timed in the hooks
    assert kaisa["step_other"] == pytest.approx(0.2)
    assert kaisa["kfac_total"] == pytest.approx(0.8)
    assert med["kfac-pytorch"]["plain"]["kfac_total"] == pytest.approx(1.4)
    fastest = summarise(rounds, min, paired=False)  # min(fwd_bwd) - min(baseline): 1.5 - 1.0
    assert fastest["kaisa_ds"]["plain"]["hook_extra"] == pytest.approx(0.5)
    # one disturbed K-FAC pass (+1.5 s in the round whose baseline was fastest): the paired median stays at
    # 0.5 s, where the difference of the medians would say 3.0 - 2.0 = 1.0 s
    rounds[0]["plain"]["kaisa_ds"]["fwd_bwd"] = 3.0
    assert summarise(rounds, median, paired=True)["kaisa_ds"]["plain"]["hook_extra"] == pytest.approx(0.5)
    assert summarise(rounds, median, paired=False)["kaisa_ds"]["plain"]["hook_extra"] == pytest.approx(1.0)


def test_missing_kfac_pytorch_exits_with_scratch_install_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kfac", None)  # makes `import kfac...` fail even where it is installed
    monkeypatch.setitem(sys.modules, "kfac.preconditioner", None)
    with pytest.raises(SystemExit) as exc:
        import_kfac()
    message = str(exc.value.code)
    assert "not importable" in message
    assert "pip install --no-deps --target" in message and "PYTHONPATH=" in message
    assert "gpauloski/kfac-pytorch" in message
    with pytest.raises(SystemExit) as exc:  # the command says the same, before building anything
        main(["--size", "tiny"])
    assert "pip install --no-deps --target" in str(exc.value.code)


def _linear_shapes(size: str, vocab: int, seq: int) -> dict[str, tuple[int, int]]:
    """(in + 1, out) of every Linear both libraries precondition (KAISA's skip list)."""
    model = bert_for_pretraining(size, vocab=vocab, seq=seq)
    return {n: (m.in_features + 1, m.out_features) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and not any(re.search(p, n) for p in KAISA_SKIP)}


def test_tiny_run_against_kfac_pytorch(tmp_path: Path) -> None:
    pytest.importorskip("kfac.preconditioner", reason="kfac-pytorch is not installed (see benchmarks/README.md)")
    out = tmp_path / "versus.json"
    batch = 2
    main(["--size", "tiny", "--vocab", "300", "--batch", str(batch), "--seq", "16", "--factor-every", "2",
          "--inv-every", "4", "--repeats", "2", "--threads", "1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert {"cpu_model", "cpu_cores", "torch", "date"} <= set(data["machine"])
    assert data["settings"]["kfac_layers"] == 12
    assert data["settings"]["kfac_pytorch_version"]  # the result names what it was compared with
    for lib in LIBRARIES:
        kinds = data["step_kinds"][lib]
        assert set(kinds) == {"decomposition", "factor", "plain"}
        assert kinds["decomposition"]["decomposition"] > 0  # the step counter selects the kind in both libraries
        assert kinds["factor"]["decomposition"] == kinds["plain"]["decomposition"] == 0
        assert kinds["factor"]["factor_capture"] > 0 and kinds["plain"]["factor_capture"] == 0
        assert all(k["preconditioning"] > 0 for k in kinds.values())
    cmp = data["comparison"]
    am = cmp["amortised"]
    assert cmp["ratio_kfp_over_kaisa"] == pytest.approx(
        am["kfac-pytorch"]["seconds_per_step"] / am["kaisa_ds"]["seconds_per_step"])
    assert len(data["rounds"]) == 2

    # memory, to the byte: kfac-pytorch holds A, G, their eigenvectors and 1/(dg daᵀ + damping) per layer;
    # kaisa_ds holds one A per distinct input (query/key/value share it), G, eigenvectors and eigenvalues
    shapes = _linear_shapes("tiny", 300, 16)
    kfp_mem, kaisa_mem = data["agreement"]["memory"]["kfac-pytorch"], data["agreement"]["memory"]["kaisa_ds"]
    assert kfp_mem["factors"] == sum(4 * (a * a + g * g) for a, g in shapes.values())
    assert kfp_mem["decompositions"] == sum(4 * (a * a + g * g + g * a) for a, g in shapes.values())
    assert kfp_mem["factors"] + kfp_mem["decompositions"] == kfp_mem["own_memory_usage_total"]
    distinct_a = [a for n, (a, _) in shapes.items() if not n.endswith((".key", ".value"))]
    gs = [g for _, g in shapes.values()]
    assert kaisa_mem["factors"] == 4 * (sum(a * a for a in distinct_a) + sum(g * g for g in gs))
    assert kaisa_mem["decompositions"] == 4 * sum(n * n + n for n in distinct_a + gs)
    assert {r["library"] for r in data["peak_rss"]} == set(LIBRARIES)

    agree = data["agreement"]
    assert agree["raw_gradients"]["max_rel_diff"] == 0  # same weights, batch and dropout masks
    conv = agree["conventions"]
    assert conv["A_statistic_max_rel_diff"] < 1e-5
    assert conv["G_statistic_times_batch_squared_max_rel_diff"] < 1e-5
    assert conv["G_scale_measured_median"] == pytest.approx(batch**2, rel=1e-4)
    assert conv["identity_prior_max_rel_diff"] < 1e-6
    # given the same factors, kfac-pytorch's eigendecomposition, preconditioning and KL clip give kaisa_ds's result
    assert agree["preconditioned_with_kaisa_factors"]["max_rel_diff"] < 1e-3
    assert agree["preconditioned"]["max_rel_diff"] > 0.1  # the conventions do matter
