"""Whether a config's K-FAC update intervals fit the run's length.

K-FAC updates its factors every ``factor_update_steps`` and decomposes them every ``inv_update_steps``, both from
the run's first step. A run no longer than one interval gets one update, at its first step, and that one
preconditions every later step: the run trains with K-FAC in name only (the main job's phase 2 once ran 30 steps
under ``inv_update_steps`` 50). This is a warning, not an error: a short smoke run may mean it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kaisa_ds.config import KFACConfig
from kaisa_ds.schedules import AUTO, AUTO_INV_STEPS_RANGE

logger = logging.getLogger(__name__)

WHAT = {"factor_update_steps": "the factors are gathered", "inv_update_steps": "the factors are decomposed"}


def interval_warnings(config: Mapping[str, Any], *, steps: int, source: str) -> list[str]:
    """One message per K-FAC interval of ``config`` (a DeepSpeed config dict) at least as long as the run's
    ``steps``; each is also logged. ``source`` names the config or phase in the messages. No kfac section, or
    ``enabled: false``: nothing to check. ``inv_update_steps`` ``"auto"`` is checked at its longest (the batch
    sets it, 10 to 50 steps); other non-integer values (schedules) are left to kaisa_ds."""
    kfac = config.get("kfac")
    if not isinstance(kfac, Mapping) or kfac.get("enabled", True) is False:
        return []
    messages = []
    defaults = KFACConfig()  # what a section that leaves an interval out gets
    for key, what in WHAT.items():
        every = shown = kfac.get(key, getattr(defaults, key))
        if every == AUTO:
            every = AUTO_INV_STEPS_RANGE[1]
            shown = f"'auto' (up to {every} steps by the batch)"
        if isinstance(every, bool) or not isinstance(every, int) or every < steps:
            continue
        given = "" if key in kfac else " (the library's default)"
        messages.append(f"{source}: kfac.{key} {shown}{given} is not shorter than the run's {steps} steps, so "
                        f"{what} only at its first step and that one update serves all {steps} steps; set "
                        f"kfac.{key} to at most {max(1, steps // 3)} for a few updates in this run (or run more steps)")
    for message in messages:
        logger.warning("%s", message)
    return messages
