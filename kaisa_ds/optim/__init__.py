"""Optimizers for BERT: LAMB with NVIDIA Apex FusedLAMB semantics, its best available implementation, and
NVIDIA's polynomial warmup schedule."""

from kaisa_ds.optim.lamb import Lamb
from kaisa_ds.optim.poly_warmup import PolyWarmUpScheduler
from kaisa_ds.optim.select import build_lamb, is_lamb_config, lamb_from_ds_config, lamb_param_groups

__all__ = ["Lamb", "PolyWarmUpScheduler", "build_lamb", "is_lamb_config", "lamb_from_ds_config", "lamb_param_groups"]
