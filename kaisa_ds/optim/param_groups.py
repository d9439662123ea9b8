"""Weight-decay parameter groups: BERT's rule, for every optimizer that decays weights (LAMB, SQuAD's AdamW)."""

from __future__ import annotations

from typing import Any

from torch import nn

# Google's BERT (optimization.py's exclude_from_weight_decay) and NVIDIA's recipe match these name parts; they catch
# LayerNorm classes of other libraries, which are no nn.LayerNorm, as HF names them.
NO_DECAY_NAME_PARTS = ("bias", "LayerNorm", "layer_norm")


def weight_decay_groups(model: nn.Module, *, weight_decay: float) -> list[dict[str, Any]]:
    """Two optimizer groups: weights with ``weight_decay``, biases and LayerNorm parameters without (BERT's rule);
    an empty group is dropped.

    A parameter is exempt when it belongs to an ``nn.LayerNorm`` (found by type, whatever its name) or its name
    contains 'bias', 'LayerNorm' or 'layer_norm'. Frozen parameters are left out; tied ones appear once.
    """
    exempt = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            exempt_p = id(p) in exempt or any(part in name for part in NO_DECAY_NAME_PARTS)
            (no_decay if exempt_p else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]
