"""One K-FAC step, phase by phase: reduce → check → commit → decompose → precondition → clip → write.

Kept apart from the preconditioner class so each phase is a small function over its state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from kaisa_ds.decomposition.decompose import Decomposition, decompose
from kaisa_ds.distributed.collectives import allreduce_mean
from kaisa_ds.enums import ComputeMethod
from kaisa_ds.precondition.apply import kl_clip_scale, precondition_eigen, precondition_inverse

if TYPE_CHECKING:
    from kaisa_ds.preconditioner import KFACPreconditioner

logger = logging.getLogger(__name__)

STAGES = ("factor_capture", "factor_reduction", "decomposition", "preconditioning", "gradient_broadcast",
          "kl_clip", "write_grads")


def reduce_window(p: KFACPreconditioner) -> dict[str, torch.Tensor]:
    """All-reduce (average) the window statistics of every factor; factors no rank captured are left out.

    Ranks that captured nothing for a factor send zeros; a per-factor count of contributing ranks
    keeps the average exact, and keeps every rank's bucket layout identical.
    """
    factors = list(p.factors().values())
    means = [f.window_mean() for f in factors]
    if not any(m is not None for m in means):
        return {}
    device = next(m for m in means if m is not None).device
    tensors = [m if m is not None else torch.zeros(f.dim if f.diagonal else (f.dim, f.dim), device=device)
               for f, m in zip(factors, means)]
    present = torch.tensor([float(m is not None) for m in means], device=device)
    symmetric = [p.config.symmetry_aware and not f.diagonal for f in factors] + [False]
    reduced, sent = allreduce_mean(tensors + [present], bucket_cap_mb=p.config.allreduce_bucket_cap_mb,
                                   symmetric=symmetric)
    p.comm_bytes["factor_allreduce"] = p.comm_bytes.get("factor_allreduce", 0) + sent
    if p.world > 1:
        counts = reduced[-1] * p.world
        reduced = [r * (p.world / c.clamp(min=1)) for r, c in zip(reduced[:-1], counts)]
        keep = [bool(c > 0) for c in counts.tolist()]
    else:
        keep = [m is not None for m in means]
    return {f.name: r for f, r, k in zip(factors, reduced, keep) if k}


def read_grads(p: KFACPreconditioner) -> dict[str, torch.Tensor]:
    """Every layer's (out, in) gradient matrix, unscaled, read in one fixed order on every rank."""
    scale = p._loss_scale()
    grads: dict[str, torch.Tensor] = {}
    for name, layer in p.layers.items():
        mat = layer.helper.grad_matrix(p.grads)
        if mat is not None:
            grads[name] = mat / scale if scale != 1.0 else mat
    return grads


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """One host sync for the whole step's overflow decision."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def update_decompositions(p: KFACPreconditioner) -> None:
    """Decompose the factors this rank is assigned, then share them within worker groups."""
    assert p.assignment is not None and p._comm is not None
    cfg = p.config
    damping = cfg.value("damping", p.steps)
    method = cfg.method.value
    facs = p.factors()
    local: dict[str, list[torch.Tensor]] = {}
    for name, f in facs.items():
        if p.assignment.inverse_worker[name] != p.rank:
            continue
        value = f.value  # at its true scale, whatever the storage dtype
        if value is None:
            continue
        dec = decompose(value, method=method, diagonal=f.diagonal, damping=damping,
                        compute_dtype=cfg.decomposition_dtype, out_dtype=cfg.inv_dtype,  # type: ignore[arg-type]
                        name=name)
        if dec is not None:
            p.decompositions[name] = dec
    for name, f in facs.items():
        if p.assignment.inverse_worker[name] == p.rank:
            local[name] = _with_flag(p, name, f)
    received = p._comm.broadcast_decompositions(p._unit_factors, local, lambda n: _placeholder(p, n))
    for name, tensors in received.items():
        if float(tensors[-1]) > 0:  # validity flag: the source has a decomposition
            p.decompositions[name] = _from_tensors(p, name, tensors[:-1])


def _layout(p: KFACPreconditioner, name: str) -> list[tuple[int, ...]]:
    f = p.factors()[name]
    n = f.dim
    if p.config.method is ComputeMethod.EIGEN:
        return [(n,)] if f.diagonal else [(n, n), (n,)]
    return [(n,)] if f.diagonal else [(n, n)]


def _placeholder(p: KFACPreconditioner, name: str) -> list[torch.Tensor]:
    device = next(iter(p.layers.values())).helper.weight.device
    dtype = p.config.inv_dtype
    return [torch.zeros(s, dtype=dtype, device=device) for s in _layout(p, name)] + [  # type: ignore[arg-type]
        torch.zeros(1, dtype=dtype, device=device)]  # type: ignore[arg-type]


def _with_flag(p: KFACPreconditioner, name: str, f: object) -> list[torch.Tensor]:
    dec = p.decompositions.get(name)
    if dec is None:
        return _placeholder(p, name)
    tensors = dec.tensors()
    return [*tensors, torch.ones(1, dtype=tensors[0].dtype, device=tensors[0].device)]


def _from_tensors(p: KFACPreconditioner, name: str, tensors: list[torch.Tensor]) -> Decomposition:
    if p.config.method is ComputeMethod.INVERSE:
        return Decomposition(inverse=tensors[0])
    if len(tensors) == 1:
        return Decomposition(eigvecs=None, eigvals=tensors[0])
    return Decomposition(eigvecs=tensors[0], eigvals=tensors[1])


def precondition_local(p: KFACPreconditioner, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Precondition the layers this rank is a gradient worker for (unpreconditioned if no decomposition)."""
    assert p.assignment is not None
    damping = p.config.value("damping", p.steps)
    out: dict[str, torch.Tensor] = {}
    for name, layer in p.layers.items():
        if name not in grads or not p.assignment.is_grad_worker(layer.unit, p.rank):
            continue
        a, g = p.decompositions.get(layer.a.name), p.decompositions.get(layer.g.name)
        if a is None or g is None:
            out[name] = grads[name]
        elif p.config.method is ComputeMethod.EIGEN:
            out[name] = precondition_eigen(grads[name], a, g, damping)
        else:
            out[name] = precondition_inverse(grads[name], a, g)
    return out


def run_step(p: KFACPreconditioner) -> None:
    """The whole K-FAC step (see the module docstring)."""
    timer = p.timer
    capture_seconds = p.capture.seconds
    timer.reset()
    timer.add("factor_capture", capture_seconds)
    p.capture.seconds = 0.0
    if p.assignment is None:
        p._finalize_structure()
    step = p.steps
    with timer.stage("factor_reduction"):
        window = reduce_window(p) if p.steps % p.config.value("factor_update_steps", step) == 0 else {}
    grads = read_grads(p)
    if not all_finite(list(window.values()) + list(grads.values())):
        p.skipped_windows += 1
        p.discard_window()
        logger.warning("K-FAC: non-finite statistics or gradients at step %d; window dropped on every rank "
                       "and gradients left alone (%d skipped so far)", step, p.skipped_windows)
        p.steps += 1
        return
    decay = p.config.value("factor_decay", step)
    factors = p.factors()
    for name, stat in window.items():
        factors[name].commit(stat, decay)
    for f in factors.values():
        f.discard()
    if step % p.config.value("inv_update_steps", step) == 0 or p._decompositions_stale:
        with timer.stage("decomposition"):
            update_decompositions(p)
        p._decompositions_stale = False
    with timer.stage("preconditioning"):
        pre = precondition_local(p, grads)
    with timer.stage("gradient_broadcast"):
        assert p._comm is not None
        pre.update(p._comm.broadcast_gradients(
            p._unit_layers, pre, lambda n: [torch.empty_like(grads[n])]))
    with timer.stage("kl_clip"):
        names = [n for n in p.layers if n in pre]
        kl = p.config.value("kl_clip", step)
        lr = p.config.value("lr", step)
        nu = (kl_clip_scale([pre[n] for n in names], [grads[n] for n in names], lr=lr, kl_clip=kl)
              if kl is not None else None)
    with timer.stage("write_grads"):
        scale = p._loss_scale()
        for n in names:
            out = pre[n] * nu if nu is not None else pre[n]
            p.layers[n].helper.write_grad(p.grads, out * scale if scale != 1.0 else out)
    p.steps += 1
