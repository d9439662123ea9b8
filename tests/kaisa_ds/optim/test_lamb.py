"""kaisa_ds Lamb against LAMB steps computed by hand (Apex FusedLAMB semantics), and its selection."""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch
from transformers import BertConfig, BertModel

from kaisa_ds.optim.lamb import Lamb
from kaisa_ds.optim.poly_warmup import PolyWarmUpScheduler
from kaisa_ds.optim.select import build_lamb, is_lamb_config, lamb_from_ds_config, lamb_param_groups


def _reference(params, grads_per_step, *, lr, b1, b2, eps, decays, max_norm):  # type: ignore[no-untyped-def]
    """LAMB written out element by element in float64 Python arithmetic."""
    ps = [[float(v) for v in p.flatten()] for p in params]
    m = [[0.0] * len(p) for p in ps]
    v = [[0.0] * len(p) for p in ps]
    for t, grads in enumerate(grads_per_step, start=1):
        gs = [[float(x) for x in g.flatten()] for g in grads]
        gnorm = math.sqrt(sum(x * x for g in gs for x in g))
        clip = max(gnorm / max_norm, 1.0)
        for i, (p, g) in enumerate(zip(ps, gs)):
            upd = []
            for j in range(len(p)):
                gj = g[j] / clip
                m[i][j] = b1 * m[i][j] + (1 - b1) * gj
                v[i][j] = b2 * v[i][j] + (1 - b2) * gj * gj
                mh, vh = m[i][j] / (1 - b1**t), v[i][j] / (1 - b2**t)
                upd.append(mh / (math.sqrt(vh) + eps) + decays[i] * p[j])
            pn, un = math.sqrt(sum(x * x for x in p)), math.sqrt(sum(x * x for x in upd))
            ratio = pn / un if (decays[i] != 0 and pn > 0 and un > 0) else 1.0
            for j in range(len(p)):
                p[j] -= lr * ratio * upd[j]
    return ps


@pytest.mark.parametrize("max_norm", [1.0, 100.0])  # 1.0: the global-norm clipping branch is taken
def test_lamb_matches_hand_computed_steps(max_norm: float) -> None:
    torch.manual_seed(0)
    w = torch.randn(3, 2, dtype=torch.float64)
    b = torch.randn(3, dtype=torch.float64)
    z = torch.zeros(2, dtype=torch.float64)  # zero norm: trust ratio falls back to 1
    params = [w.clone().requires_grad_(), b.clone().requires_grad_(), z.clone().requires_grad_()]
    grads = [[torch.randn_like(p) * 3 for p in params] for _ in range(3)]
    opt = Lamb([{"params": [params[0], params[2]], "weight_decay": 0.1}, {"params": [params[1]], "weight_decay": 0.0}],
               lr=0.05, betas=(0.9, 0.99), eps=1e-6, max_grad_norm=max_norm)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()
    want = _reference([w, b, z], grads, lr=0.05, b1=0.9, b2=0.99, eps=1e-6, decays=[0.1, 0.0, 0.1],
                      max_norm=max_norm)
    for p, ref in zip(params, want):
        torch.testing.assert_close(p.detach().flatten(), torch.tensor(ref, dtype=torch.float64), rtol=1e-10,
                                   atol=1e-12)


def test_state_dict_round_trip_gives_identical_next_step() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    opt_a = Lamb(a.parameters(), lr=0.01)
    x = torch.randn(8, 4)
    a(x).sum().backward()
    opt_a.step()
    b.load_state_dict(a.state_dict())
    opt_b = Lamb(b.parameters(), lr=0.01)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as a checkpoint file would
    for m, o in ((a, opt_a), (b, opt_b)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_param_groups_exclude_bias_and_layernorm() -> None:
    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32, max_position_embeddings=16))
    decay, no_decay = lamb_param_groups(model, weight_decay=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all("bias" not in names[id(p)] and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert all("bias" in names[id(p)] or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_build_lamb_picks_pure_pytorch_on_cpu_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        opt, name = build_lamb(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    assert name == "kaisa_ds.Lamb" and isinstance(opt, Lamb)
    assert "kaisa_ds.optim.Lamb" in caplog.text and "Apex" in caplog.text


def test_lamb_from_ds_config() -> None:
    assert is_lamb_config({"type": "LAMB"}) and not is_lamb_config({"type": "Adam"}) and not is_lamb_config(None)
    opt, _ = lamb_from_ds_config({"type": "Lamb", "params": {"lr": 0.006, "weight_decay": 0.01, "max_coeff": 10}},
                                 torch.nn.Linear(2, 2))
    assert opt.param_groups[0]["lr"] == 0.006
    with pytest.raises(ValueError, match=r"optimizer\.params: unknown Lamb key\(s\) \['learning_rate'\]"):
        lamb_from_ds_config({"type": "Lamb", "params": {"learning_rate": 1}}, torch.nn.Linear(2, 2))


def test_poly_warmup_follows_the_formula() -> None:
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=6e-3)
    sched = PolyWarmUpScheduler(opt, warmup_proportion=0.2, total_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0
    assert lrs[10] == pytest.approx(6e-3 * (10 / 100) / 0.2)
    assert lrs[20] == pytest.approx(6e-3 * (1 - 0.2) ** 0.5)
    assert lrs[99] == pytest.approx(6e-3 * (0.01) ** 0.5)
    with pytest.raises(ValueError, match="warmup_proportion"):
        PolyWarmUpScheduler(opt, warmup_proportion=1.5, total_steps=10)
