"""Writes this folder's K-FAC checkpoints with the code of a given commit (run from that commit's checkout):

    cd <checkout of a98885d> && PYTHONPATH=. python <this file> <this folder>

a98885d is the last commit before the architecture move (issue 24). test_pre_move.py loads what this wrote with
today's code and checks that training continues exactly as it did in the old code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kaisa_ds import KFACPreconditioner

try:
    from kaisa_ds.shards import save_shards  # before the move
except ImportError:
    from kaisa_ds.checkpoint.shards import save_shards  # type: ignore[no-redef]
from tests.support.models import TinyTransformerish

SETTINGS = {"eigen": {"grafting": "none"}, "inverse": {"compute_method": "inverse", "grafting": "none"}}  # as made
SAVE_AT, STEPS = 5, 9


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, 11, (4, 7), generator=g), torch.randn(4, 7, 5, generator=g)) for _ in range(STEPS)]


def make(method: str) -> tuple[torch.nn.Module, KFACPreconditioner, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyTransformerish()
    precond = KFACPreconditioner(model, factor_update_steps=2, inv_update_steps=3, damping=0.01, lr=0.05,
                                 **SETTINGS[method])
    return model, precond, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def step(model: torch.nn.Module, precond: KFACPreconditioner, opt: torch.optim.Optimizer,
         batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    opt.zero_grad()
    loss = F.mse_loss(model(batch[0]), batch[1])
    loss.backward()
    precond.step()
    opt.step()
    return float(loss.item())


def main(out: Path) -> None:
    expected = {}
    for method in SETTINGS:
        model, precond, opt = make(method)
        data = batches()
        for batch in data[:SAVE_AT]:
            step(model, precond, opt, batch)
        folder = out / method
        folder.mkdir(parents=True, exist_ok=True)
        save_shards(precond, folder / "shards")
        torch.save(precond.state_dict(), folder / "state_dict.pt")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, folder / "rest.pt")
        expected[method] = [step(model, precond, opt, batch) for batch in data[SAVE_AT:]]
    (out / "expected_losses.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
