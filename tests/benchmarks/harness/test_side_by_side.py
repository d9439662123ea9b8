"""SideBySide, shared by step_cost and versus_kfac_pytorch: each runner's step kind set from the interval, the
order flipped by ``first``, each copy right after its own baseline pass, and with an optimizer the baseline put
back to the runner's weights so both models keep computing the same thing."""

from __future__ import annotations

import copy

import torch

from benchmarks.harness.batches import random_batch
from benchmarks.harness.interval import Interval
from benchmarks.harness.models import bert_for_pretraining
from benchmarks.harness.side_by_side import SideBySide


class Recorder:
    """A stand-in K-FAC library: records its step numbers, and the gradients it finds at ``step()``."""

    def __init__(self, name: str, model: torch.nn.Module, log: list[tuple[str, str, int]]) -> None:
        self.name, self.model, self.log = name, model, log
        self.steps = 0

    def set_step(self, step: int) -> None:
        self.steps = step

    def step(self) -> None:
        fresh = all(p.grad is not None for p in self.model.parameters() if p.requires_grad)
        self.log.append((self.name, "step" if fresh else "step without gradients", self.steps))

    def stages(self) -> dict[str, float]:
        return {"factor_capture": 0.0}

    def layer_names(self) -> list[str]:
        return []

    def memory(self) -> dict[str, int]:
        return {}


def _setup(optimizer: bool) -> tuple[SideBySide, list[tuple[str, str, int]]]:
    base = bert_for_pretraining("tiny", vocab=300, seq=16)
    log: list[tuple[str, str, int]] = []
    runners = [Recorder(n, copy.deepcopy(base), log) for n in ("a", "b")]
    opt = torch.optim.SGD(base.parameters(), lr=0.5) if optimizer else None
    run = SideBySide(base=base, batch=random_batch(2, 16, 300, "cpu"), runners=runners, interval=Interval(2, 4),
                     device=torch.device("cpu"), optimizer=opt)
    return run, log


def test_each_runner_steps_as_its_kind_in_the_order_asked() -> None:
    run, log = _setup(optimizer=False)
    rows = run.round(["decomposition", "plain"], first=1)
    assert log == [("b", "step", 4), ("a", "step", 4), ("b", "step", 1), ("a", "step", 1)]
    assert list(rows) == ["decomposition", "plain"] and list(rows["plain"]) == ["b", "a"]
    assert list(rows["plain"]["a"]) == ["baseline_fwd_bwd", "fwd_bwd", "precond_step", "factor_capture"]
    assert all(v > 0 for k, v in rows["plain"]["a"].items() if k != "factor_capture")


def test_the_baseline_optimizer_step_is_timed_and_undone() -> None:
    run, _ = _setup(optimizer=True)
    before = [p.detach().clone() for p in run.base.parameters()]
    rows = run.round(["factor"])
    assert list(rows["factor"]["a"])[:4] == ["baseline_fwd_bwd", "optimizer_step", "fwd_bwd", "precond_step"]
    assert rows["factor"]["a"]["optimizer_step"] > 0
    assert all(torch.equal(p, q) for p, q in zip(run.base.parameters(), before))
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in run.base.parameters())  # SGD moved them
