"""Micro-batch and accumulation passes of a planned run, resolved from flags and the DeepSpeed JSON as DeepSpeed
resolves them, so the plan is of the run the config would launch.

DeepSpeed's rule (``DeepSpeedConfig._set_batch_related_parameters``): of ``train_batch_size``,
``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps`` any two give the third, all three must agree
(``train = micro × passes × world``), and ``train_batch_size`` alone means one pass. A flag replaces the JSON key
of the same meaning before the rule is applied. HF's ``"auto"`` (the Trainer fills it from ``TrainingArguments``)
is a value the planner cannot know: ``train_batch_size: "auto"`` is what the other two make it, the other two
need their flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_MICRO = 32  # without any batch key or flag
MICRO, PASSES, TRAIN = "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"
FLAGS = {MICRO: "--micro-batch", PASSES: "--passes"}
HF_ARGS = {MICRO: "per_device_train_batch_size", PASSES: "gradient_accumulation_steps"}


@dataclass(frozen=True)
class Batch:
    micro: int  # sequences per rank per pass
    passes: int  # accumulation passes per optimizer step


def _json_int(ds: dict[str, Any], key: str, *, source: str) -> int | str | None:
    """The JSON's value of ``key``: a positive int, ``"auto"``, or None when absent."""
    value = ds.get(key)
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r} in {source} is not valid; give a positive integer (or \"auto\" with "
                         f"{FLAGS.get(key, 'the flags --micro-batch and --passes')})")
    return value


def _auto(key: str, source: str) -> ValueError:
    return ValueError(f"{key} is \"auto\" in {source}: the HF Trainer fills it from TrainingArguments."
                      f"{HF_ARGS[key]}, which the planner cannot see; pass {FLAGS[key]} N")


def resolve_batch(ds: dict[str, Any] | None, *, micro: int | None, passes: int | None, world: int,
                  source: str = "the DeepSpeed config") -> Batch:
    """The run's micro-batch and passes (flags ``micro`` / ``passes`` win over the JSON's keys); an error naming the
    keys, their values and the fix when DeepSpeed would refuse them or the plan cannot know them."""
    for flag, value in (("--micro-batch", micro), ("--passes", passes)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: must be at least 1")
    if ds is None:
        return Batch(micro=micro or DEFAULT_MICRO, passes=passes or 1)
    given = {MICRO: micro or _json_int(ds, MICRO, source=source),
             PASSES: passes or _json_int(ds, PASSES, source=source)}
    train = _json_int(ds, TRAIN, source=source)
    m, p = (v if isinstance(v, int) else None for v in given.values())
    auto = [key for key, v in given.items() if v == "auto"]
    # "auto" is known only as train_batch_size's share of a known other one; train "auto" is the product of the two
    if auto and (not isinstance(train, int) or (m is None and p is None)):
        raise _auto(auto[0], source)
    if not isinstance(train, int):
        return Batch(micro=m or DEFAULT_MICRO, passes=p or 1)
    if m is not None and p is not None:
        if m * p * world != train:
            raise ValueError(f"{TRAIN} {train} in {source} is not micro-batch {m} x passes {p} x world "
                             f"{world} = {m * p * world} (DeepSpeed refuses this); change {TRAIN}, or "
                             "--micro-batch / --passes / --world")
        return Batch(micro=m, passes=p)
    if m is not None or p is not None:
        key, known, flagged = (MICRO, m, micro) if m is not None else (PASSES, p, passes)
        assert known is not None
        if train % (known * world):
            named = FLAGS[key] if flagged else key
            raise ValueError(f"{TRAIN} {train} in {source} is no multiple of {named} {known} x world {world} "
                             f"(DeepSpeed refuses this); change {TRAIN}, {FLAGS[key]} or --world")
        other = train // (known * world)
        return Batch(micro=known, passes=other) if m is not None else Batch(micro=other, passes=known)
    if train % world:
        raise ValueError(f"{TRAIN} {train} in {source} is no multiple of --world {world}; change one of them")
    return Batch(micro=train // world, passes=1)
