"""Sampled factor statistics: exact at fraction 1, unbiased below it, the same rows on every rank."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kaisa_ds import KFACConfig, KFACPreconditioner
from kaisa_ds.factors.sampling import PassSampler, RowSampler
from kaisa_ds.factors.statistics import second_moment_sum
from tests.support.models import TinyTransformerish
from tests.support.training import EVERY_STEP


def _rows(n: int = 64, d: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    trend = torch.linspace(0.1, 3.0, n).unsqueeze(1)  # rows differ systematically: a biased subset shows
    return torch.randn(n, d, generator=g) * trend + trend


def test_fraction_one_keeps_every_row_and_the_exact_statistic() -> None:
    x = _rows()
    sampler = RowSampler(fraction=1.0)
    assert sampler.rows(x, step=3, pass_index=0) is x
    full, n = second_moment_sum(x, append_ones=True)
    same, m = second_moment_sum(x, append_ones=True, select=lambda r: sampler.rows(r, step=3, pass_index=0))
    assert n == m == 64 and torch.equal(full, same)


def test_sampled_mean_is_unbiased() -> None:
    x = _rows()
    full_sum, n = second_moment_sum(x, append_ones=True)
    full = full_sum / n
    sampler = RowSampler(fraction=0.25)
    draws = []
    for step in range(600):
        s, k = second_moment_sum(x, append_ones=True, select=lambda r, s=step: sampler.rows(r, step=s, pass_index=0))
        assert k == math.ceil(0.25 * 64)
        draws.append(s / k)
    single = (draws[0] - full).norm() / full.norm()
    averaged = (torch.stack(draws).mean(0) - full).norm() / full.norm()
    assert single > 0.05  # one draw is noisy...
    assert averaged < 0.02  # ...but the draws average to the full statistic
    first_rows = x[:16]  # a biased rule (always the first rows) would not
    biased = (first_rows.t() @ first_rows / 16 - full[:5, :5]).norm() / full[:5, :5].norm()
    assert biased > 0.3


def test_rows_depend_on_step_and_pass_only() -> None:
    a, b = RowSampler(fraction=0.5), RowSampler(fraction=0.5)  # e.g. two ranks
    kw = {"device": torch.device("cpu")}
    assert torch.equal(a.indices(100, step=7, pass_index=1, **kw), b.indices(100, step=7, pass_index=1, **kw))
    assert not torch.equal(a.indices(100, step=7, pass_index=1, **kw), a.indices(100, step=8, pass_index=1, **kw))
    assert not torch.equal(a.indices(100, step=7, pass_index=1, **kw), a.indices(100, step=7, pass_index=2, **kw))


def _factors(fraction: float, step: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, kl_clip=None, factor_sample_fraction=fraction, **EVERY_STEP)
    precond.steps = step  # a different subset per run, as on successive steps
    g = torch.Generator().manual_seed(5)
    ids, target = torch.randint(0, 11, (8, 6), generator=g), torch.randn(8, 6, 5, generator=g)
    F.mse_loss(model(ids), target).backward()
    precond.step()
    return {f"{n}.{k}": getattr(ly, f"{k.lower()}_factor").float() for n, ly in precond.layers.items()
            for k in ("A", "G")}


def test_preconditioner_factors_are_unbiased_and_differ_per_step() -> None:
    full = _factors(1.0, 0)
    runs = [_factors(0.5, step) for step in range(0, 120, 6)]  # steps that capture factors (interval 1)
    for key, want in full.items():
        if key.endswith("emb.A"):
            continue  # token counts are always taken from every token
        mean = torch.stack([r[key] for r in runs]).mean(0)
        assert (mean - want).norm() / want.norm() < 0.1, key
    assert not torch.equal(runs[0]["query.A"], full["query.A"])


def test_fraction_is_validated_by_name() -> None:
    for bad in (0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match="factor_sample_fraction"):
            KFACConfig(factor_sample_fraction=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kfac\.factor_sample_fraction"):
        KFACConfig.from_dict({"factor_sample_fraction": 2})


# ------------------------------------------------------------------ pass subsets of an accumulation window
PASSES = 4


def _window_factors(fraction: float, step: int, *, loss_scale: float = 1.0,
                    dtype: str | None = None) -> tuple[dict[str, torch.Tensor], frozenset[int]]:
    """The factors after one window of PASSES micro-batches (the loss averaged over passes, as DeepSpeed does),
    committed at ``step``, and the passes the sampler chose."""
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, kl_clip=None, accumulation_steps=PASSES, factor_pass_fraction=fraction,
                                 loss_scale=lambda: loss_scale, factor_dtype=dtype, **EVERY_STEP)
    precond.steps = step
    g = torch.Generator().manual_seed(5)
    for _ in range(PASSES):
        ids, target = torch.randint(0, 11, (8, 6), generator=g), torch.randn(8, 6, 5, generator=g)
        (F.mse_loss(model(ids), target) * loss_scale / PASSES).backward()
    chosen = precond.feed.pass_sampler.chosen(step)
    precond.step()
    return ({f"{n}.{k}": getattr(ly, f"{k.lower()}_factor").float() for n, ly in precond.layers.items()
             for k in ("A", "G")}, chosen)


def test_pass_fraction_one_is_the_full_window() -> None:
    full, chosen = _window_factors(1.0, 0)
    assert chosen == frozenset(range(PASSES))
    subset, _ = _window_factors(0.25, 0)
    assert not torch.equal(subset["query.A"], full["query.A"])  # the subset is a real estimate...
    torch.manual_seed(0)
    plain = KFACPreconditioner(TinyTransformerish(), kl_clip=None)  # ...and fraction 1 is the default path
    assert plain.feed.pass_sampler.active is False


@pytest.mark.parametrize(("dtype", "tol"), [(None, 1e-5), ("fp16", 5e-3)])
def test_pass_subset_is_exactly_unbiased_over_the_choices(dtype: str | None, tol: float) -> None:
    """With equal-size passes, averaging the single-pass estimates over the 4 possible choices gives the full
    window's factors exactly (FP32 windows; FP16 ones within their rounding), G included: its passes² rescaling
    must count the skipped passes too."""
    full, _ = _window_factors(1.0, 0, dtype=dtype)
    by_choice: dict[frozenset[int], dict[str, torch.Tensor]] = {}
    step = 0
    while len(by_choice) < PASSES and step < 200:
        factors, chosen = _window_factors(0.25, step, loss_scale=64.0, dtype=dtype)  # and under a loss scale
        assert len(chosen) == 1
        by_choice.setdefault(chosen, factors)
        step += 1
    assert len(by_choice) == PASSES
    for key, want in full.items():
        mean = torch.stack([f[key] for f in by_choice.values()]).mean(0)
        assert (mean - want).norm() / want.norm() < tol, key
        single = next(iter(by_choice.values()))[key]
        if not key.endswith("emb.A"):
            assert (single - want).norm() / want.norm() > 10 * tol, key  # each choice alone differs


def test_passes_are_chosen_uniformly_and_alike_on_every_rank() -> None:
    a, b = PassSampler(fraction=0.5, passes=8), PassSampler(fraction=0.5, passes=8)  # e.g. two ranks
    counts = [0] * 8
    for step in range(800):
        chosen = a.chosen(step)
        assert chosen == b.chosen(step) and len(chosen) == 4
        for i in chosen:
            counts[i] += 1
    assert all(360 < c < 440 for c in counts), counts  # 400 each in expectation
    assert a.chosen(1) != a.chosen(2) or a.chosen(2) != a.chosen(3)
    assert [a.keeps(step=5, pass_index=i) for i in range(8)] == [i in a.chosen(5) for i in range(8)]


def test_pass_fraction_is_validated_by_name() -> None:
    for bad in (0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match="factor_pass_fraction"):
            KFACConfig(factor_pass_fraction=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kfac\.factor_pass_fraction"):
        KFACConfig.from_dict({"factor_pass_fraction": 0})
    with pytest.raises(ValueError, match=r"factor_pass_fraction=0\.5 needs accumulation_steps"):
        KFACPreconditioner(TinyTransformerish(), factor_pass_fraction=0.5)


def test_a_factor_update_takes_in_at_most_max_statistic_rows() -> None:
    """512 rows a pass against a cap of 128: the first update takes them all (the rows are not known before it), the
    next ones a quarter of each pass; no cap: every row; the cap holds across a checkpoint."""
    from tests.support.models import TinyMLP

    def rows_of_second_update(**options: object) -> tuple[int, KFACPreconditioner]:
        torch.manual_seed(0)
        model = TinyMLP()
        precond = KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=1, **options)
        x = torch.randn(512, 6)
        model(x).pow(2).mean().backward()
        precond.step()
        model.zero_grad()
        model(x).pow(2).mean().backward()
        return precond.layers["fc1"].a.window_rows, precond

    capped, precond = rows_of_second_update(max_statistic_rows=128)
    assert capped == 128 and precond.statistic_rows == 512
    assert rows_of_second_update(max_statistic_rows=None)[0] == 512
    assert rows_of_second_update()[0] == 512  # the default cap (2,048 rows) is above this batch
    resumed = KFACPreconditioner(TinyMLP(), max_statistic_rows=128)
    resumed.load_state_dict(precond.state_dict())
    assert resumed.feed.sampler.fraction == 0.25
