"""KAISA's communication pattern over process groups built from an :class:`Assignment`.

Decompositions travel inside a layer's worker group (from each factor's inverse worker to the
other gradient workers); preconditioned gradients travel inside receiver groups (from the one
gradient worker of the column to the ranks that did not compute them). Every broadcast is one flat
buffer per source rank, issued in the same order on every member.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from kaisa_ds.distributed.assignment import Assignment
from kaisa_ds.distributed.collectives import broadcast_flat

Placeholder = Callable[[str], list[torch.Tensor]]


def _new_groups(groups: list[list[int]], world: int) -> list[dist.ProcessGroup | None]:
    """One process group per rank list (every rank must create all of them, in the same order)."""
    out: list[dist.ProcessGroup | None] = []
    for ranks in groups:
        if len(ranks) == 1 or len(ranks) == world:
            out.append(None)  # no group needed (size 1) or the default world group
        else:
            out.append(dist.new_group(ranks))
    return out


class KAISACommunicator:
    """Issues the decomposition and gradient broadcasts for one rank."""

    def __init__(self, assignment: Assignment, *, rank: int) -> None:
        self.assignment = assignment
        self.rank = rank
        distributed = assignment.world > 1
        self._worker_pgs = _new_groups(assignment.worker_groups, assignment.world) if distributed else []
        self._receiver_pgs = _new_groups(assignment.receiver_groups, assignment.world) if distributed else []
        self.bytes_sent: dict[str, int] = {}

    def _count(self, stage: str, tensors: list[torch.Tensor]) -> None:
        n = sum(t.numel() * t.element_size() for t in tensors)
        self.bytes_sent[stage] = self.bytes_sent.get(stage, 0) + n

    def broadcast_decompositions(
        self, unit_factors: dict[str, list[str]], local: dict[str, list[torch.Tensor]], placeholder: Placeholder
    ) -> dict[str, list[torch.Tensor]]:
        """Send this rank's decompositions to its worker group and receive the others' (by factor name)."""
        a = self.assignment
        if a.grad_workers == 1:
            return {}
        index = self.rank // a.grad_workers
        group = self._worker_pgs[index]
        names = [f for unit, fs in unit_factors.items() if a.unit_group[unit] == index for f in fs]
        received: dict[str, list[torch.Tensor]] = {}
        for src in a.worker_group(index):
            mine = [f for f in names if a.inverse_worker[f] == src]
            if not mine:
                continue
            shapes = [placeholder(f) for f in mine] if src != self.rank else [local[f] for f in mine]
            flat_in = [t for ts in shapes for t in ts]
            if src == self.rank:
                self._count("decomposition_broadcast", flat_in)
            flat_out = broadcast_flat(flat_in, src=src, group=group)
            if src != self.rank:
                pos = 0
                for f, ts in zip(mine, shapes):
                    received[f] = flat_out[pos:pos + len(ts)]
                    pos += len(ts)
        return received

    def broadcast_gradients(
        self, unit_layers: dict[str, list[str]], local: dict[str, torch.Tensor], placeholder: Placeholder
    ) -> dict[str, torch.Tensor]:
        """Send the gradients this rank preconditioned to its receiver group; receive the rest."""
        a = self.assignment
        members = a.receiver_groups[a.receiver_group_of(self.rank)]
        if len(members) == 1:
            return {}
        group = self._receiver_pgs[a.receiver_group_of(self.rank)]
        received: dict[str, torch.Tensor] = {}
        for src in members:
            index = src // a.grad_workers
            names = [n for unit, ls in unit_layers.items() if a.unit_group[unit] == index for n in ls]
            if not names:
                continue
            tensors = [local[n] for n in names] if src == self.rank else [placeholder(n)[0] for n in names]
            if src == self.rank:
                self._count("gradient_broadcast", tensors)
            out = broadcast_flat(tensors, src=src, group=group)
            if src != self.rank:
                received.update(zip(names, out))
        return received
