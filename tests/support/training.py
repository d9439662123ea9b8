"""The plain K-FAC training loop the tests share: MSE loss, backward, precondition, optimizer step."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from kaisa_ds import KFACPreconditioner

# Statistics and decompositions at every step: for tests whose point needs the factors of each step (the library's
# defaults space them out for cost)
EVERY_STEP = {"factor_update_steps": 1, "inv_update_steps": 1}


def train_steps(model: nn.Module, precond: KFACPreconditioner, opt: torch.optim.Optimizer,
                batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """One optimizer step per (input, target) batch; the losses, in order."""
    losses = []
    for inputs, target in batches:
        opt.zero_grad()
        loss = F.mse_loss(model(inputs), target)
        loss.backward()
        precond.step()
        opt.step()
        losses.append(loss.item())
    return losses
