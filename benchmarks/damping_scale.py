"""The curvature scale of BERT-tiny's K-FAC factors on the convergence study's tune part, and the tuned absolute
dampings expressed as relative ones: the measurement behind ``kaisa_ds.damping.DEFAULT_RELATIVE_DAMPING``.

For each regime of :mod:`benchmarks.convergence.regimes` (its sequence length, its global batch in one process
and its accumulation passes, the loss averaged over the passes), an untrained BERT-tiny sees ``--windows``
windows of the tune part; after them every layer's A and G factors (running average, decay 0.95) give their
mean eigenvalues ``trace / dim``. A relative damping ``r`` stands for the absolute damping ``r · mean(λ_A) ·
mean(λ_G)`` of that layer, so the regime's tuned absolute damping ``γ`` is ``γ / (mean(λ_A) mean(λ_G))`` in
relative terms (reported as the median and range over layers). For each ``--relative`` candidate (and for the
tuned absolute damping), the same windows are preconditioned and the K-FAC effectiveness check's figures after the
last window are reported: the mean over layers of the damping share and of the cosine to the raw gradient (K-FAC
is a rescaled gradient at cosine ~1).

    python -m benchmarks.convergence parts ...   # or any text: the tune part of the study's pooled sources
    python -m benchmarks.damping_scale --text runs/convergence/parts/<digest>/tune.txt \\
        --vocab ../shared/data/bert-vocab/vocab.txt --out benchmarks/results/damping_scale.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.accuracy import text_batches
from benchmarks.convergence.regimes import REGIMES
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from kaisa_ds.plan.bert_sizes import KAISA_SKIP

TUNED = {"small": 1e-4, "large": 1e-6}  # the convergence study's chosen absolute dampings (results/convergence)


def _run(regime_name: str, batches: list[dict[str, torch.Tensor]], *, windows: int, **damping: Any) -> Any:
    """A preconditioner with ``damping`` after ``windows`` windows; returns it and the mean figures."""
    from kaisa_ds import KFACPreconditioner

    regime = REGIMES[regime_name]
    passes = regime.gas
    model = bert_for_pretraining(regime.model_size, vocab=30522, seq=regime.seq)
    precond = KFACPreconditioner(model, kl_clip=None, skip_layers=KAISA_SKIP, accumulation_steps=passes, **damping)
    for w in range(windows):
        model.zero_grad(set_to_none=True)
        for b in batches[w * passes:(w + 1) * passes]:
            (pretraining_loss(model, b) / passes).backward()
        precond.step()
    eff = precond.diagnostics.effectiveness.values()
    figures = {"damping": damping, "mean_damping_share": statistics.mean(e["damping_share"] for e in eff),
               "mean_cosine_to_raw": statistics.mean(e["cosine"] for e in eff)}
    return precond, figures


def measure(regime_name: str, *, text: Path, vocab: Path, windows: int, relative: list[float]) -> dict[str, Any]:
    regime = REGIMES[regime_name]
    batch, passes = regime.micro_batch * regime.ranks, regime.gas
    batches = text_batches(text, vocab, batch=batch, seq=regime.seq, count=windows * passes)
    precond, tuned = _run(regime_name, batches, windows=windows, damping=TUNED[regime_name])
    candidates = [tuned] + [_run(regime_name, batches, windows=windows, relative_damping=r)[1] for r in relative]
    layers = {}
    for name, layer in precond.layers.items():
        a, g = layer.a.value, layer.g.value
        if a is None or g is None:
            continue
        mean_a = float(a.float().mean() if layer.a.diagonal else a.float().diagonal().mean())
        mean_g = float(g.float().diagonal().mean())
        layers[name] = {"mean_eig_a": mean_a, "mean_eig_g": mean_g,
                        "tuned_as_relative": TUNED[regime_name] / (mean_a * mean_g)}
    rel = [v["tuned_as_relative"] for v in layers.values()]
    return {"regime": regime_name, "batch": batch, "passes": passes, "seq": regime.seq, "windows": windows,
            "tuned_absolute": TUNED[regime_name], "relative_median": statistics.median(rel),
            "relative_min": min(rel), "relative_max": max(rel), "candidates": candidates, "layers": layers}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.damping_scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", type=Path, required=True, help="the tune part (never the report part)")
    p.add_argument("--vocab", type=Path, required=True)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--relative", type=float, nargs="*", default=[1.0, 10.0, 100.0, 1000.0])
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    res: dict[str, Any] = {"command": "python -m benchmarks.damping_scale " + " ".join(argv or []),
           "regimes": [measure(r, text=args.text, vocab=args.vocab, windows=args.windows, relative=args.relative)
                       for r in TUNED]}
    for r in res["regimes"]:
        print(f"{r['regime']}: tuned absolute {r['tuned_absolute']:g} = relative {r['relative_median']:.3g} "
              f"(layers {r['relative_min']:.3g} .. {r['relative_max']:.3g})")
        for c in r["candidates"]:
            print(f"   {c['damping']}: mean damping share {c['mean_damping_share']:.3f}, mean cosine to raw "
                  f"{c['mean_cosine_to_raw']:.4f}")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
