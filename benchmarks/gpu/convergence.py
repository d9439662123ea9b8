"""Part ``convergence``: NOT IMPLEMENTED. The GPU time-to-accuracy regime (BERT-mini/small, bigger batch).

Why not yet: (1) a GPU session's device time (15 minutes on 2026-11-26) is taken by the parts tests, step_cost, eigh
and diagnose (three calls, 12 minutes on the first H100); (2) benchmarks.convergence trains through bert_pretrain
under the deepspeed launcher and reads its text and vocabulary from ``../shared/data``, which does not travel to the
device machine (only the checkout does), and bert_pretrain's data pipeline imports ``datasets``, which the GPU image
lacks (its wheels and dill/multiprocess would have to be carried too); (3) a GPU regime (model, batch, tuned
learning rates) does not exist in benchmarks/convergence/regimes.py. This part records that and reports ok = false,
so no call mistakes it for a result.

"""

from __future__ import annotations

from typing import Any

from benchmarks.gpu.context import Context

WHY = ("not implemented: no device time left for it in a 15-minute GPU session, and the convergence runner reads "
       "../shared/data (not carried) through bert_pretrain, which needs datasets (not in the image); see "
       "benchmarks/gpu/convergence.py")


def run(ctx: Context) -> dict[str, Any]:
    out = {"ok": False, "implemented": False, "why": WHY}
    ctx.write("convergence", out)
    return out
