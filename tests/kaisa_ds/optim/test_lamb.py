"""kaisa_ds Lamb against LAMB steps written out by hand, element by element, from Apex's FusedLAMB kernels."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from kaisa_ds.optim.lamb import Lamb, global_grad_norm


def _reference(params: list[torch.Tensor], grads_per_step: list[list[torch.Tensor]], *, lr: float, b1: float,
               b2: float, eps: float, decays: list[float], max_norm: float, adam_w: bool = True,
               nvlamb: bool = False, bias_correction: bool = True) -> list[list[float]]:
    """LAMB in float64 Python scalars, following csrc/multi_tensor_lamb.cu stage 1 and stage 2."""
    ps = [[float(v) for v in p.flatten()] for p in params]
    m = [[0.0] * len(p) for p in ps]
    v = [[0.0] * len(p) for p in ps]
    for t, grads in enumerate(grads_per_step, start=1):
        gs = [[float(x) for x in g.flatten()] for g in grads]
        gnorm = math.sqrt(sum(x * x for g in gs for x in g))
        clip = gnorm / max_norm if max_norm > 0 and gnorm > max_norm else 1.0
        bc1, bc2 = (1 - b1**t, 1 - b2**t) if bias_correction else (1.0, 1.0)
        for i, (p, g) in enumerate(zip(ps, gs)):
            upd = []
            for j in range(len(p)):
                gj = g[j] / clip + (0.0 if adam_w else decays[i] * p[j])
                m[i][j] = b1 * m[i][j] + (1 - b1) * gj
                v[i][j] = b2 * v[i][j] + (1 - b2) * gj * gj
                u = (m[i][j] / bc1) / (math.sqrt(v[i][j] / bc2) + eps)
                upd.append(u + (decays[i] * p[j] if adam_w else 0.0))
            pn, un = math.sqrt(sum(x * x for x in p)), math.sqrt(sum(x * x for x in upd))
            ratio = pn / un if (nvlamb or decays[i] != 0) and pn > 0 and un > 0 else 1.0
            for j in range(len(p)):
                p[j] -= lr * ratio * upd[j]
    return ps


def _run(params: list[torch.Tensor], grads: list[list[torch.Tensor]], opt: Lamb) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()


def _three_params() -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """A weight, a bias and an all-zero weight (its trust ratio must fall back to 1), 3 steps of grads."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 2, dtype=torch.float64, generator=gen)
    b = torch.randn(3, dtype=torch.float64, generator=gen)
    z = torch.zeros(2, dtype=torch.float64)
    grads = [[torch.randn(p.shape, dtype=torch.float64, generator=gen) * 3 for p in (w, b, z)] for _ in range(3)]
    return [w, b, z], grads


@pytest.mark.parametrize("max_norm", [1.0, 100.0, 0.0])  # 1.0: clipping taken; 100: not taken; 0: turned off
@pytest.mark.parametrize(("adam_w", "nvlamb", "bias_correction"),
                         [(True, False, True), (False, False, True), (True, True, False)])
def test_lamb_matches_hand_computed_steps(max_norm: float, adam_w: bool, nvlamb: bool,
                                          bias_correction: bool) -> None:
    init, grads = _three_params()
    params = [p.clone().requires_grad_() for p in init]
    opt = Lamb([{"params": [params[0], params[2]], "weight_decay": 0.1}, {"params": [params[1]], "weight_decay": 0.0}],
               lr=0.05, betas=(0.9, 0.99), eps=1e-6, max_grad_norm=max_norm, adam_w_mode=adam_w,
               use_nvlamb=nvlamb, bias_correction=bias_correction)
    _run(params, grads, opt)
    want = _reference(init, grads, lr=0.05, b1=0.9, b2=0.99, eps=1e-6, decays=[0.1, 0.0, 0.1], max_norm=max_norm,
                      adam_w=adam_w, nvlamb=nvlamb, bias_correction=bias_correction)
    for p, ref in zip(params, want):
        torch.testing.assert_close(p.detach().flatten(), torch.tensor(ref, dtype=torch.float64), rtol=1e-10,
                                   atol=1e-12)
    assert [g["step"] for g in opt.param_groups] == [3, 3]


def test_first_step_in_closed_form() -> None:
    """p=[3,4], g=[0.6,0.8] (‖g‖=1), max_grad_norm 0.5 → g/2; step 1: m̂/√v̂ = sign(g) = [1,1] (eps 0),
    update = [1,1] + 0.1·p = [1.3,1.4], ratio = 5/√3.65."""
    p = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    p.grad = torch.tensor([0.6, 0.8], dtype=torch.float64)
    Lamb([p], lr=0.01, eps=0.0, weight_decay=0.1, max_grad_norm=0.5).step()
    ratio = 5 / math.sqrt(1.3**2 + 1.4**2)
    torch.testing.assert_close(p.detach(), torch.tensor([3 - 0.01 * ratio * 1.3, 4 - 0.01 * ratio * 1.4],
                                                        dtype=torch.float64))


def test_params_without_grad_are_skipped_and_grads_left_alone() -> None:
    a = torch.ones(3, requires_grad=True)
    frozen = torch.ones(2, requires_grad=True)
    a.grad = torch.full((3,), 5.0)
    opt = Lamb([{"params": [a]}, {"params": [frozen]}], lr=0.1)
    opt.step()
    assert torch.equal(frozen.detach(), torch.ones(2)) and frozen not in opt.state
    assert torch.equal(a.grad, torch.full((3,), 5.0))  # Apex overwrites p.grad with the update; we do not
    assert not torch.equal(a.detach(), torch.ones(3))
    assert [g["step"] for g in opt.param_groups] == [1, 1]  # Apex bumps every group's step on every call


def test_low_precision_params_follow_the_fp32_arithmetic() -> None:
    init, grads = _three_params()
    params32 = [p.float().requires_grad_() for p in init]
    params16 = [p.to(torch.bfloat16).float().to(torch.bfloat16).requires_grad_() for p in init]
    for params, dtype in ((params32, torch.float32), (params16, torch.bfloat16)):
        opt = Lamb(params, lr=0.05)
        _run(params, [[g.to(dtype) for g in step] for step in grads], opt)
        assert all(opt.state[p]["exp_avg"].dtype == dtype for p in params)
    for p16, p32 in zip(params16, params32):
        assert p16.dtype == torch.bfloat16
        torch.testing.assert_close(p16.detach().float(), p32.detach(), rtol=2e-2, atol=2e-2)


def test_global_grad_norm_spans_dtypes_without_overflow() -> None:
    big = torch.full((4,), 60000.0, dtype=torch.float16)  # its own fp16 norm (120000) would overflow to inf
    small = torch.tensor([3.0, 4.0])
    assert global_grad_norm([big, small]).item() == pytest.approx(math.sqrt(4 * 60000.0**2 + 25), rel=1e-6)


def test_state_dict_round_trip_gives_identical_next_steps() -> None:
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    b = copy.deepcopy(a)
    opt_a = Lamb([{"params": a[0].parameters()}, {"params": a[1].parameters(), "weight_decay": 0.0}], lr=0.01)
    x = torch.randn(8, 4)
    a(x).pow(3).sum().backward()
    opt_a.step()
    b.load_state_dict(a.state_dict())
    opt_b = Lamb([{"params": b[0].parameters()}, {"params": b[1].parameters(), "weight_decay": 0.0}], lr=0.5)
    saved = copy.deepcopy(opt_a.state_dict())  # as a checkpoint file would hold it
    opt_b.load_state_dict(saved)
    for _ in range(2):
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert opt_b.param_groups[0]["lr"] == 0.01 and opt_b.param_groups[0]["step"] == 3


@pytest.mark.parametrize(("kwargs", "key"), [({"lr": -1.0}, "lr"), ({"betas": (0.9, 1.0)}, "betas"),
                                             ({"max_grad_norm": -1.0}, "max_grad_norm")])
def test_bad_arguments_name_the_argument(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"Lamb: {key}="):
        Lamb([torch.zeros(1, requires_grad=True)], **kwargs)
