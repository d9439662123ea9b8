"""Every KAISA strategy, at world sizes 1, 2 and 4, gives the single-process preconditioned gradients."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from kaisa_ds import KFACPreconditioner
from tests.support.launch import run_distributed
from tests.support.models import TinyTransformerish, TinyWithUnusedHead

GLOBAL_BATCH = 8
STEPS = 3


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(123)
    return [(torch.randint(0, 11, (GLOBAL_BATCH, 5), generator=g), torch.randn(GLOBAL_BATCH, 5, 5, generator=g))
            for _ in range(STEPS)]


def _train(fraction: float | str, rank: int, world: int, symmetry_aware: bool = False,
           unused_head: bool = False) -> list[dict[str, torch.Tensor]]:
    """Run STEPS K-FAC steps on this rank's shard; return the preconditioned grads after each step."""
    torch.manual_seed(0)
    model: torch.nn.Module = TinyWithUnusedHead() if unused_head else TinyTransformerish()
    precond = KFACPreconditioner(model, grad_worker_fraction=fraction, damping=0.01, kl_clip=0.05, lr=0.1,
                                 factor_update_steps=1, inv_update_steps=2, factor_decay=0.9,
                                 symmetry_aware=symmetry_aware)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shard = GLOBAL_BATCH // world
    out = []
    for ids, target in _batches():
        ids, target = ids[rank * shard:(rank + 1) * shard], target[rank * shard:(rank + 1) * shard]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(ids), target).backward()
        if world > 1:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
        precond.step()
        out.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
    return out


def _strategies(world: int) -> list[float | str]:
    return sorted({1.0, 1.0 / world, 0.5} if world > 1 else {1.0}, reverse=True) + (["mem-opt"] if world > 1 else [])


def _all_strategies(rank: int, world: int) -> dict[str, list[dict[str, torch.Tensor]]]:
    results = {str(f): _train(f, rank, world) for f in _strategies(world)}
    results["symmetric"] = _train(1.0, rank, world, symmetry_aware=True)
    return results


def _unused_head_strategies(rank: int, world: int) -> dict[str, list[dict[str, torch.Tensor]]]:
    return {str(f): _train(f, rank, world, unused_head=True) for f in _strategies(world)}


@pytest.fixture(scope="module")
def reference() -> list[dict[str, torch.Tensor]]:
    return _train(1.0, 0, 1)


def _assert_close(got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]], label: str) -> None:
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        for name in w:
            torch.testing.assert_close(g[name], w[name], rtol=1e-3, atol=1e-5,
                                       msg=lambda m, n=name, s=step: f"{label} step {s} {n}: {m}")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 ranks: ~19 s
def test_strategies_match_single_process(world: int, reference: list[dict[str, torch.Tensor]]) -> None:
    per_rank = run_distributed(_all_strategies, world)
    for rank, results in enumerate(per_rank):
        assert set(results) == {str(f) for f in _strategies(world)} | {"symmetric"}
        for label, got in results.items():
            _assert_close(got, reference, f"world {world} rank {rank} {label}")


def test_kfac_changes_gradients(reference: list[dict[str, torch.Tensor]]) -> None:
    """Guards the equivalence test against passing because K-FAC did nothing."""
    torch.manual_seed(0)
    model = TinyTransformerish()
    ids, target = _batches()[0]
    torch.nn.functional.mse_loss(model(ids), target).backward()
    plain = model.out.weight.grad
    assert not torch.allclose(plain, reference[0]["out.weight"], atol=1e-4)


def test_a_layer_without_gradient_gives_the_same_result_under_every_strategy() -> None:
    """A layer whose hook fires but whose weight gets no gradient (an unused head) is left alone by every
    strategy, and the other layers match the single-process run (it used to raise KeyError in MEM/HYBRID-OPT)."""
    want = _train(1.0, 0, 1, unused_head=True)
    assert all("head.weight" not in step for step in want)
    for rank, results in enumerate(run_distributed(_unused_head_strategies, 2)):
        for label, got in results.items():
            _assert_close(got, want, f"unused head, rank {rank} {label}")
            assert all(set(g) == set(w) for g, w in zip(got, want))


# Half-precision factors (windows and traffic in the storage dtype, kaisa_ds.distributed.reduction): the documented
# tolerance of the preconditioned gradients against the FP32 single process, at any world size and accumulation split.
HALF_GRAD_TOL = {"fp16": 2e-2, "bf16": 1e-1}


def _factor_run(rank: int, world: int, *, dtype: str | None, overlap: bool, passes: int,
                started: list[int] | None = None,
                pass_fraction: float = 1.0) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """STEPS steps of this rank's shard in ``passes`` accumulation passes; grads per step and the final factors."""
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, damping=0.01, kl_clip=0.05, lr=0.1, factor_update_steps=1, inv_update_steps=2,
                                 factor_decay=0.9,
                                 factor_dtype=dtype, overlap_factor_reduction=overlap, accumulation_steps=passes,
                                 allreduce_bucket_cap_mb=1e-4,  # tiny buckets: several start in the backward pass
                                 factor_pass_fraction=pass_fraction)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shard = GLOBAL_BATCH // world
    grads = []
    for ids, target in _batches():
        ids, target = ids[rank * shard:(rank + 1) * shard], target[rank * shard:(rank + 1) * shard]
        opt.zero_grad()
        for ids_i, t_i in zip(ids.chunk(passes), target.chunk(passes)):
            (torch.nn.functional.mse_loss(model(ids_i), t_i) / passes).backward()
        if world > 1:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
        if started is not None and precond.structure is not None:
            started.append(precond.window_reducer().started)
        precond.step()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
    return grads, {n: f.value.float() for n, f in precond.factors().items() if f.value is not None}


def _overlap_pairs(rank: int, world: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for dtype in (None, "fp16"):
        for passes, fraction in ((1, 1.0), (2, 1.0), (4, 0.5)):  # the last: 2 of 4 passes feed the factors
            started: list[int] = []
            out[f"{dtype} x{passes} of {fraction}"] = (
                _factor_run(rank, world, dtype=dtype, overlap=True, passes=passes, started=started,
                            pass_fraction=fraction),
                _factor_run(rank, world, dtype=dtype, overlap=False, passes=passes, pass_fraction=fraction), started)
    return out


def test_overlapped_reduction_gives_the_factors_of_the_synchronous_one() -> None:
    """2 gloo ranks, with and without gradient accumulation (and with half of the passes sampled), FP32 and
    FP16: buckets start in the backward pass
    of later windows (not the first: the structure is built by its step), and the factors and gradients are
    bit-identical to reducing everything inside step()."""
    for rank, results in enumerate(run_distributed(_overlap_pairs, 2)):
        for label, (overlapped, synchronous, started) in results.items():  # type: ignore[misc]
            assert started and all(n > 0 for n in started), f"rank {rank} {label}: nothing started early"
            (g_o, f_o), (g_s, f_s) = overlapped, synchronous
            assert f_o.keys() == f_s.keys()
            for name in f_s:
                assert torch.equal(f_o[name], f_s[name]), f"rank {rank} {label} factor {name}"
            for step, (a, b) in enumerate(zip(g_o, g_s)):
                for name in b:
                    assert torch.equal(a[name], b[name]), f"rank {rank} {label} step {step} {name}"


def _half_runs(rank: int, world: int) -> dict[str, list[dict[str, torch.Tensor]]]:
    return {f"{d} x{k}": _factor_run(rank, world, dtype=d, overlap=True, passes=k)[0]
            for d in ("fp16", "bf16") for k in (1, 2)}


def test_half_precision_factors_match_fp32_single_process_within_documented_tolerance() -> None:
    want = _factor_run(0, 1, dtype=None, overlap=True, passes=1)[0]
    for rank, results in enumerate(run_distributed(_half_runs, 2)):
        for label, got in results.items():
            tol = HALF_GRAD_TOL[label.split()[0]]
            for step, (g, w) in enumerate(zip(got, want, strict=True)):
                for name in w:
                    err = ((g[name] - w[name]).norm() / w[name].norm()).item()
                    assert err <= tol, f"rank {rank} {label} step {step} {name}: {err:.2e} > {tol}"


def _default_strategy(rank: int, world: int) -> dict[str, object]:
    """What ``grad_worker_fraction`` left at its default resolves to on gloo (CPU) ranks, and its gradients."""
    torch.manual_seed(0)
    precond = KFACPreconditioner(TinyTransformerish(), damping=0.01, kl_clip=0.05, lr=0.1)
    return {"grad_workers": precond.grad_workers, "grads": _train("auto", rank, world)}


def test_cpu_ranks_default_to_mem_opt_with_the_single_process_gradients(
        reference: list[dict[str, torch.Tensor]]) -> None:
    """On CPU ranks every rank preconditioning every layer (COMM-OPT) repeats the per-step matmuls world times over
    for nothing: the default gives each layer one rank and broadcasts its result (MEM-OPT), with the same
    gradients."""
    for rank, got in enumerate(run_distributed(_default_strategy, 2)):
        assert got["grad_workers"] == 1
        _assert_close(got["grads"], reference, f"auto rank {rank}")  # type: ignore[arg-type]
