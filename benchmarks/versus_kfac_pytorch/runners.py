"""Each library's runner, built with the shared settings (settings.py)."""

from __future__ import annotations

import torch

from benchmarks.harness.side_by_side import KaisaRunner, Runner
from benchmarks.versus_kfac_pytorch.kfac_pytorch import KfpRunner, import_kfac
from benchmarks.versus_kfac_pytorch.settings import (
    COMPUTE_METHOD,
    DAMPING,
    FACTOR_DECAY,
    GRAFTING,
    KL_CLIP,
    STAGE_NAMES,
)
from kaisa_ds.plan.bert_sizes import KAISA_SKIP


def kaisa_runner(model: torch.nn.Module, *, factor_every: int, inv_every: int, lr: float, cuda: bool,
                 inv_dtype: str = "fp32", sample_fraction: float = 1.0) -> KaisaRunner:
    """kaisa_ds's KFACPreconditioner on ``model`` with the shared settings."""
    from kaisa_ds import KFACPreconditioner

    precond = KFACPreconditioner(
        model, factor_update_steps=factor_every, inv_update_steps=inv_every, damping=DAMPING,
        factor_decay=FACTOR_DECAY, kl_clip=KL_CLIP, grafting=GRAFTING, lr=lr, compute_method=COMPUTE_METHOD,
        skip_layers=KAISA_SKIP, inv_dtype=inv_dtype, factor_sample_fraction=sample_fraction)
    return KaisaRunner(precond, cuda=cuda, stage_names=STAGE_NAMES)


def make_runner(library: str, model: torch.nn.Module, *, factor_every: int, inv_every: int, lr: float,
                cuda: bool, inv_dtype: str = "fp32", sample_fraction: float = 1.0, prediv: bool = True) -> Runner:
    """A runner of one library; ``inv_dtype`` applies to both, ``sample_fraction`` to kaisa_ds only (kfac-pytorch
    has no such option) and ``prediv`` (its cached eigenvalue denominator) to kfac-pytorch only."""
    if library == KaisaRunner.name:
        return kaisa_runner(model, factor_every=factor_every, inv_every=inv_every, lr=lr, cuda=cuda,
                            inv_dtype=inv_dtype, sample_fraction=sample_fraction)
    return KfpRunner(model, factor_every=factor_every, inv_every=inv_every, lr=lr, cuda=cuda, kfp=import_kfac(),
                     inv_dtype=inv_dtype, prediv=prediv)
