"""Optimizers for BERT: LAMB with NVIDIA Apex FusedLAMB semantics, its best available implementation,
NVIDIA's polynomial warmup schedule, and BERT's weight-decay groups."""

from kaisa_ds.optim.lamb import APEX_EPS, APEX_MAX_GRAD_NORM, Lamb
from kaisa_ds.optim.param_groups import weight_decay_groups
from kaisa_ds.optim.poly_warmup import PolyWarmUpScheduler
from kaisa_ds.optim.select import build_lamb, is_lamb_config, lamb_from_ds_config

__all__ = ["APEX_EPS", "APEX_MAX_GRAD_NORM", "Lamb", "PolyWarmUpScheduler", "build_lamb", "is_lamb_config",
           "lamb_from_ds_config", "weight_decay_groups"]
