"""Test-only fault injection, so the fault suite can kill a rank or fill the disk at an exact point.

Set ``BERT_PRETRAIN_FAULT=<point>:<rank>:<step>:<action>`` (several separated by ``,``): at ``point`` ("step":
before that optimizer step; "save": inside the checkpoint save of that step, after DeepSpeed has written its
files and kaisa_ds its K-FAC shards, but before the completion marker) on ``rank``, ``kill`` sends SIGKILL to the
process itself and ``enospc`` raises ``OSError(ENOSPC)`` as a full disk would. Unset (always, outside tests): no-op.
"""

from __future__ import annotations

import errno
import logging
import os
import signal

ENV = "BERT_PRETRAIN_FAULT"
logger = logging.getLogger(__name__)


def inject(point: str, *, rank: int, step: int) -> None:
    """Fail here as ``BERT_PRETRAIN_FAULT`` asks, if it names this point, rank and step."""
    for spec in filter(None, os.environ.get(ENV, "").split(",")):
        where, on_rank, on_step, action = spec.split(":")
        if (where, int(on_rank), int(on_step)) != (point, rank, step):
            continue
        logger.warning("%s: injecting %s at %s of step %d on rank %d", ENV, action, point, step, rank)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "enospc":
            raise OSError(errno.ENOSPC, f"No space left on device (injected by {ENV})")
        raise ValueError(f"{ENV}: unknown action {action!r} in {spec!r}; use kill or enospc")
