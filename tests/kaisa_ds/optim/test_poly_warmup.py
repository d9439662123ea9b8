"""PolyWarmUpScheduler: NVIDIA's BERT schedule, the k-th optimizer step at progress k / total_steps."""

from __future__ import annotations

import pytest
import torch

from kaisa_ds.optim.poly_warmup import PolyWarmUpScheduler


def _lrs(sched: PolyWarmUpScheduler, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    """The lr each optimizer step ran with."""
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


def _sgd(lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


def test_values_follow_nvidia_formula() -> None:
    opt = _sgd(6e-3)
    lrs = _lrs(PolyWarmUpScheduler(opt, warmup_proportion=0.2, total_steps=100), opt, 102)
    assert lrs[0] == pytest.approx(6e-3 * (1 / 100) / 0.2)  # step 1 already moves (NVIDIA)
    assert lrs[9] == pytest.approx(6e-3 * (10 / 100) / 0.2)  # step 10, warming up
    assert lrs[18] == pytest.approx(6e-3 * (19 / 100) / 0.2)  # last warmup step
    assert lrs[19] == pytest.approx(6e-3 * (1 - 0.2) ** 0.5)  # step 20: progress 0.2 is past the warmup
    assert lrs[49] == pytest.approx(6e-3 * 0.5**0.5)
    assert lrs[98] == pytest.approx(6e-3 * 0.01**0.5)
    assert lrs[99] == 0.0 and lrs[101] == 0.0  # step total_steps and beyond: 0, never NaN
    assert max(lrs) == lrs[18]  # NVIDIA's curve drops from 0.95·base to √0.8·base when the warmup ends


def test_every_param_group_is_scaled_and_degree_applies() -> None:
    a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [a], "lr": 1.0}, {"params": [b], "lr": 0.1}], lr=1.0)
    sched = PolyWarmUpScheduler(opt, warmup_proportion=0.0, total_steps=10, degree=2.0)
    _lrs(sched, opt, 3)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([(1 - 0.4) ** 2, 0.1 * (1 - 0.4) ** 2])


def test_state_dict_round_trip_resumes_the_schedule() -> None:
    opt = _sgd(1.0)
    sched = PolyWarmUpScheduler(opt, warmup_proportion=0.3, total_steps=20)
    _lrs(sched, opt, 7)
    opt2 = _sgd(123.0)
    sched2 = PolyWarmUpScheduler(opt2, warmup_proportion=0.9, total_steps=5)
    sched2.load_state_dict(sched.state_dict())
    opt2.param_groups[0]["lr"] = sched2.get_last_lr()[0]  # DeepSpeed restores the optimizer's lr with its state
    assert _lrs(sched2, opt2, 5) == pytest.approx(_lrs(sched, opt, 5))


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"warmup_proportion": 1.0, "total_steps": 10}, "warmup_proportion"),
    ({"warmup_proportion": -0.1, "total_steps": 10}, "warmup_proportion"),
    ({"warmup_proportion": 0.1, "total_steps": 0}, "total_steps"),
    ({"warmup_proportion": 0.1, "total_steps": 10.5}, "total_steps"),
    ({"warmup_proportion": 0.1, "total_steps": 10, "degree": -1.0}, "degree"),
])
def test_bad_arguments_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}="):
        PolyWarmUpScheduler(_sgd(1.0), **kwargs)
