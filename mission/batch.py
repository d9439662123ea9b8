"""The main job's phase-1 recipe at a batch (benchmarks/results/mission/rule_batch.md).

Phase 1 runs at 8,192 tokens a step by default: the smallest batch of the scaling study at or above LAMB's fitted
critical batch (docs/studies/batch_scaling.md). ``--phase1-batch`` reruns it at another batch with the same token
budget, LAMB at the rate the study's tuning chose there (K-FAC at LAMB's rate), so a user sees what K-FAC gives at
their batch. The recipe only reshapes a shipped config; it never touches the ``kfac`` section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEFAULT_TOKENS = 8192  # the rule's batch: tokens a step
TOKEN_BUDGET = 1500 * 2048  # phase 1's tokens: the small regime's (1500 steps of 2,048), as before the move
MAX_MICRO = 64  # sequences a rank and pass, as in the scaling study; more accumulate
WARMUP = 0.1  # of phase 1's steps: the study's fixed share
EVALS = 30  # held-out evaluations a phase 1, as in the study
MIN_EVAL_EVERY = 5
# LAMB's rate chosen by the scaling study's tuning at each batch it ran, on its own tune part
# (benchmarks/results/convergence/scaling/b<tokens>/chosen.json); elsewhere the grid's centre, untuned
TUNED_LR = {2048: 0.01, 4096: 0.014142, 8192: 0.02, 16384: 0.028284, 32768: 0.02, 65536: 0.028284}
BASE_TOKENS, BASE_LR = 2048, 0.01


@dataclass(frozen=True)
class Phase1Recipe:
    """How one phase-1 batch is trained: its shape on the ranks, its length and LAMB's rate."""

    tokens: int
    sequences_per_rank: int
    micro_batch: int
    steps: int
    lr: float
    tuned: bool  # False: the study never tuned LAMB at this batch; the rate is its square-root scaling

    def apply(self, config: dict[str, Any], *, ranks: int) -> dict[str, Any]:
        """``config`` with this batch, rate, warmup and length; every other key (``kfac`` included) as given."""
        out = {**config, "optimizer": {**config["optimizer"], "params": {**config["optimizer"]["params"]}},
               "lr_schedule": {**config["lr_schedule"]}}
        out["train_batch_size"] = self.sequences_per_rank * ranks
        out["train_micro_batch_size_per_gpu"] = self.micro_batch
        out.pop("gradient_accumulation_steps", None)  # DeepSpeed infers it (micro × gas × ranks = batch)
        out["optimizer"]["params"]["lr"] = self.lr
        out["lr_schedule"].update(warmup_proportion=WARMUP, total_steps=self.steps)
        return out

    def untuned_warning(self) -> str | None:
        if self.tuned:
            return None
        return (f"--phase1-batch {self.tokens}: the scaling study did not tune LAMB at this batch (it tuned "
                f"{', '.join(map(str, TUNED_LR))} tokens), so LAMB and K-FAC run at the square-root scaled rate "
                f"{self.lr:g}; LAMB may be off its best, and the comparison with it")


def phase1_recipe(*, tokens: int, seq: int, ranks: int, steps: int | None = None) -> Phase1Recipe:
    """The recipe at ``tokens`` a step of ``seq``-token sequences over ``ranks``; ``steps`` default: the budget."""
    sequences, rem = divmod(tokens, seq * ranks)
    if rem or sequences < 1:
        unit = seq * ranks
        raise ValueError(f"--phase1-batch {tokens}: not a whole number of {seq}-token sequences on {ranks} ranks; "
                         f"give a multiple of {unit} (e.g. {max(1, round(tokens / unit)) * unit})")
    micro = max(m for m in range(1, min(sequences, MAX_MICRO) + 1) if sequences % m == 0)
    steps = steps if steps is not None else max(1, round(TOKEN_BUDGET / tokens))
    lr = TUNED_LR.get(tokens, round(BASE_LR * math.sqrt(tokens / BASE_TOKENS), 6))
    return Phase1Recipe(tokens=tokens, sequences_per_rank=sequences, micro_batch=micro, steps=steps, lr=lr,
                        tuned=tokens in TUNED_LR)


def eval_interval(steps: int) -> int:
    """Steps between held-out evaluations of a ``steps``-long phase 1: about :data:`EVALS` of them, as the study."""
    return max(MIN_EVAL_EVERY, round(steps / EVALS))
