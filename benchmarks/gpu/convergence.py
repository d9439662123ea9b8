"""Part ``convergence``: NOT IMPLEMENTED. The GPU time-to-accuracy regime (BERT-mini/small, bigger batch).

Why not yet: benchmarks.convergence runs bert_pretrain under the deepspeed launcher on 2 CPU ranks and reads its
text and vocabulary from ``../shared/data``, which does not travel to the device machine (only the checkout does);
a GPU regime needs the data carried in an ignored folder, a GPU regime in benchmarks/convergence/regimes.py and
tuning runs that fit 9-minute calls. This part records that and exits non-zero, so no call mistakes it for a result.
"""

from __future__ import annotations

from typing import Any

from benchmarks.gpu.context import Context

WHY = ("not implemented: the convergence runner reads ../shared/data (not carried to the device) and runs 2 CPU "
       "ranks; see benchmarks/gpu/convergence.py")


def run(ctx: Context) -> dict[str, Any]:
    out = {"ok": False, "implemented": False, "why": WHY}
    ctx.write("convergence", out)
    return out
