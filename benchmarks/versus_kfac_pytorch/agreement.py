"""Do the two libraries compute the same thing? One factor+decomposition step of each on the same batch: their
preconditioned gradients, the conventions that separate them (measured per factor), and the gradients once
kfac-pytorch is given kaisa_ds's factors; also each library's K-FAC memory after that step."""

from __future__ import annotations

import argparse
import copy
import math
from typing import Any

import torch

from benchmarks.harness.batches import random_batch
from benchmarks.harness.models import bert_for_pretraining, fwd_bwd
from benchmarks.harness.timing import median
from benchmarks.versus_kfac_pytorch.kfac_pytorch import KfpRunner, import_kfac
from benchmarks.versus_kfac_pytorch.runners import kaisa_runner
from benchmarks.versus_kfac_pytorch.settings import FACTOR_DECAY


def grad_matrices(model: torch.nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """``[∇W | ∇b]`` of each named Linear layer (FP32 copies)."""
    modules = dict(model.named_modules())
    out = {}
    for n in names:
        m = modules[n]
        out[n] = torch.cat([m.weight.grad.float(), m.bias.grad.float().reshape(-1, 1)], dim=1).clone()
    return out


def rel_diff(x: torch.Tensor, *, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref|: relative to the matrix's largest entry, so entries near zero do not dominate."""
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(x.reshape(1, -1).double(), y.reshape(1, -1).double()))


def agreement(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One factor+decomposition step (step 0) of each library on the same batch: their preconditioned gradients,
    the conventions that separate them (measured per factor), and the gradients once kfac-pytorch is given
    kaisa_ds's factors. Also each library's K-FAC memory after that decomposition step."""
    base = bert_for_pretraining(args.size, vocab=args.vocab, seq=args.seq).to(device)
    batch = random_batch(args.batch, args.seq, args.vocab, device, seed=1)
    opts: dict[str, Any] = {"factor_every": args.factor_every, "inv_every": args.inv_every, "lr": args.lr,
            "cuda": device.type == "cuda"}
    kaisa = kaisa_runner(copy.deepcopy(base), **opts)
    kfp = KfpRunner(copy.deepcopy(base), kfp=import_kfac(), **opts)
    names = kaisa.layer_names()
    kfp_modules = dict(kfp.model.named_modules())
    kfp_layers = {n: kfp.precond._layers[kfp_modules[n]][1] for n in names}
    new_stats: dict[tuple[str, str], torch.Tensor] = {}  # kfac-pytorch's statistic of this batch, per factor
    for n, layer in kfp_layers.items():
        for f in ("a", "g"):
            update = getattr(layer, f"update_{f}_factor")

            def snapshot(*a: Any, _n: str = n, _f: str = f, _layer: Any = layer, _update: Any = update,
                         **kw: Any) -> Any:
                new_stats[(_n, _f)] = getattr(_layer, f"_{_f}_batch").clone()
                return _update(*a, **kw)

            setattr(layer, f"update_{f}_factor", snapshot)
    for r in (kaisa, kfp):
        r.set_step(0)  # step 0 updates factors and decompositions in both
        torch.manual_seed(2)  # BERT's dropout: the same masks in both passes
        fwd_bwd(r.model, batch)
    raw = {r.name: grad_matrices(r.model, names) for r in (kaisa, kfp)}
    for r in (kaisa, kfp):
        r.step()
    pre = {r.name: grad_matrices(r.model, names) for r in (kaisa, kfp)}
    memory = {r.name: r.memory() for r in (kaisa, kfp)}

    # conventions, per factor: kfac-pytorch's G statistic is E[g gᵀ] of the output gradients as they are
    # (kaisa_ds: times batch², the per-sample gradients of a mean loss), and its first running average is
    # ξ·I + (1-ξ)·statistic (kaisa_ds: the statistic itself)
    xi, bsq = FACTOR_DECAY, float(args.batch) ** 2
    a_stat, g_stat, g_scale, prior = [], [], [], []
    for n in names:
        kl, pl = kaisa.precond.layers[n], kfp_layers[n]
        a_k, g_k = kl.a.value, kl.g.value
        assert a_k is not None and g_k is not None, n
        a_p, g_p = new_stats[(n, "a")], new_stats[(n, "g")]
        a_stat.append(rel_diff(a_p, ref=a_k))
        g_stat.append(rel_diff(bsq * g_p, ref=g_k))
        g_scale.append(float((g_k * g_p).sum() / (g_p * g_p).sum()))  # least squares: g_k ≈ s·g_p
        for stat, factor in ((a_p, pl.a_factor), (g_p, pl.g_factor)):
            eye = torch.eye(stat.shape[0], device=device)
            prior.append(rel_diff(factor, ref=xi * eye + (1 - xi) * stat))
        pl.a_factor, pl.g_factor = a_k.clone(), g_k.clone()  # for the aligned run below

    # aligned: kfac-pytorch with kaisa_ds's factors, from the same raw gradients, through its own
    # eigendecomposition, preconditioning, KL clip and write-back
    with torch.no_grad():
        for n in names:
            g = raw[kfp.name][n]
            kfp_modules[n].weight.grad.copy_(g[:, :-1])
            kfp_modules[n].bias.grad.copy_(g[:, -1])
    kfp.set_step(0)
    kfp.step()
    aligned = grad_matrices(kfp.model, names)

    def worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
        diffs = {n: rel_diff(a[n], ref=b[n]) for n in names}
        layer = max(diffs, key=lambda n: diffs[n])
        norm = math.sqrt(sum(float(a[n].double().square().sum()) for n in names)
                         / sum(float(b[n].double().square().sum()) for n in names))
        return {"max_rel_diff": diffs[layer], "layer": layer, "min_cosine": min(cosine(a[n], b[n]) for n in names),
                "norm_ratio": norm}

    return {
        "raw_gradients": worst(raw[kfp.name], raw[kaisa.name]),
        "preconditioned": worst(pre[kfp.name], pre[kaisa.name]),
        "conventions": {
            "A_statistic_max_rel_diff": max(a_stat),
            "G_statistic_times_batch_squared_max_rel_diff": max(g_stat),
            "G_scale_measured_median": median(g_scale), "G_scale_min": min(g_scale), "G_scale_max": max(g_scale),
            "G_scale_expected_batch_squared": bsq,
            "identity_prior_max_rel_diff": max(prior),
        },
        "preconditioned_with_kaisa_factors": worst(aligned, pre[kaisa.name]),
        "memory": memory, "layers": len(names),
    }

