"""How close the warm-started eigenbasis refresh preconditions to exact eigendecompositions, on real factors.

BERT trains on a real text with K-FAC's defaults (exact FP32 eigh at every decomposition: the factors are the run's
own). At every decomposition, shadow refresh chains (``compute_method="eigen-refresh"``, one per ``KEEP:EXACT``
setting of :class:`kaisa_ds.decomposition.refresh.RefreshMethod`) update *their own* bases in force from the same
factors, as a refresh run would, and every layer's raw gradient is preconditioned three ways at the same damping:
by FP64 eigh of the factors (the reference), by each chain, and by the chain's previous basis left stale. Reported
per chain: the per-layer cosine to the reference (median, 1st percentile and minimum over every layer and
decomposition), the factors kept, refreshed and re-decomposed, and the seconds per decomposition round against eigh.

    python -m benchmarks.refresh_accuracy --text ../shared/data/wikitext-2/valid.txt \\
        --vocab ../shared/data/bert-vocab/vocab.txt                 # BERT-mini, 32 x 64, 1000 steps
    python -m benchmarks.refresh_accuracy --steps 60 --size tiny --chains 0.05:0.5   # a quick look
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.accuracy import text_batches
from benchmarks.harness.batches import random_batch
from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from benchmarks.harness.output import publish, table
from bert_pretrain.data.tokenizer import vocab_tokens
from kaisa_ds import KFACPreconditioner
from kaisa_ds.decomposition.decompose import decompose_all
from kaisa_ds.decomposition.refresh import RefreshMethod
from kaisa_ds.decomposition.registry import method_for
from kaisa_ds.decomposition.tensors import Decomposition
from kaisa_ds.enums import ComputeMethod
from kaisa_ds.plan.bert_sizes import KAISA_SKIP
from kaisa_ds.precondition.grouped import GroupedPreconditioner

CHAINS = ("0.05:0.5", "0.05:0.3", "0.05:0.2", "0.05:0.1", "0.02:0.2", "0.05:0.2:3")


def chain_method(spec: str) -> RefreshMethod:
    """``"KEEP:EXACT[:STEPS]"`` → the refresh with those thresholds (and refresh steps)."""
    keep, exact, *steps = spec.split(":")
    return RefreshMethod(keep=float(keep), exact_above=float(exact), steps=int(steps[0]) if steps else 2)


def _clone(d: Decomposition) -> Decomposition:
    """A private copy (the grouped preconditioner re-points decompositions at its stacks)."""
    return Decomposition(*(t.clone() if t is not None else None for t in (d.eigvecs, d.eigvals, d.inverse)))


def _copy(decs: dict[str, Decomposition]) -> dict[str, Decomposition]:
    return {n: _clone(d) for n, d in decs.items()}


def _precondition(precond: KFACPreconditioner, decs: dict[str, Decomposition],
                  grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every layer's gradient preconditioned with ``decs`` (eigenbases) at the damping in force."""
    pairs = {n: (decs[ly.a.name], decs[ly.g.name]) for n, ly in precond.layers.items()
             if ly.a.name in decs and ly.g.name in decs and n in grads}
    grouped = GroupedPreconditioner(method_for(ComputeMethod.EIGEN))
    return grouped.apply(grads, pairs_copy(pairs), damping=precond.config.damping_at(precond.steps))


def pairs_copy(pairs: dict[str, tuple[Decomposition, Decomposition]]) -> dict[str, tuple[Decomposition, Decomposition]]:
    """The pairs with private decompositions, a factor shared by several layers still one object."""
    seen: dict[int, Decomposition] = {}
    out = {}
    for name, (a, g) in pairs.items():
        out[name] = tuple(seen.setdefault(id(d), _clone(d)) for d in (a, g))
    return out  # type: ignore[return-value]


Worst = dict[str, list[tuple[float, int, str]]]  # chain -> (cosine, step, layer) of its 5 worst


def _cosines(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], *, worst: Worst, chain: str,
             step: int) -> list[float]:
    out = []
    for n in ref:
        if n in got:
            c = torch.nn.functional.cosine_similarity(got[n].flatten().double(), ref[n].flatten().double(), dim=0)
            out.append(float(c))
            worst.setdefault(chain, []).append((float(c), step, n))
    worst[chain] = sorted(worst.get(chain, []))[:5]
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    vocab_size = 30522
    if args.text:
        batches = text_batches(args.text, args.vocab, batch=args.batch, seq=args.seq, count=args.windows)
        vocab_size = len(set(vocab_tokens(args.vocab)))
    else:
        batches = [random_batch(args.batch, args.seq, vocab_size, "cpu", seed=i) for i in range(args.windows)]
    model = bert_for_pretraining(args.size, vocab=vocab_size, seq=args.seq)
    precond = KFACPreconditioner(model, skip_layers=KAISA_SKIP, lr=args.lr, compute_method="eigen")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    chains = {c: chain_method(c) for c in args.chains}
    bases: dict[str, dict[str, Decomposition]] = {c: {} for c in chains}
    cosines: dict[str, list[float]] = {c: [] for c in [*chains, "stale"]}
    counts: dict[str, list[int]] = {c: [0, 0, 0] for c in chains}
    seconds: dict[str, list[float]] = {c: [] for c in [*chains, "eigh_fp32"]}
    worst: Worst = {}
    losses = []
    for step in tqdm(range(args.steps), desc="steps", unit="step"):
        batch = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = pretraining_loss(model, batch)
        loss.backward()
        decomposing = step % precond.config.inv_update_steps_at(step, rows=precond.statistic_rows or
                                                                 args.batch * args.seq) == 0
        grads = {n: ly.helper.grad_matrix(precond.grads) for n, ly in precond.layers.items()}
        precond.step()
        if decomposing and step > 0:
            seconds["eigh_fp32"].append(precond.timings["decomposition"])
            audit(precond, {n: g for n, g in grads.items() if g is not None}, chains, bases, cosines, counts,
                  seconds, worst)
        elif decomposing:  # the first decomposition: every chain starts from the exact basis
            for c in chains:
                bases[c] = _copy(dict(precond.decompositions))
        opt.step()
        losses.append(loss.item())
    rows = []
    for c in [*chains, "stale"]:
        vals = sorted(cosines[c])
        rows.append({"chain": c, "median_cosine": vals[len(vals) // 2] if vals else None,
                     "p01_cosine": vals[len(vals) // 100] if vals else None, "min_cosine": vals[0] if vals else None,
                     "layer_decompositions": len(vals),
                     **({"kept": counts[c][0], "refreshed": counts[c][1], "exact": counts[c][2],
                         "round_s": sum(seconds[c]) / max(1, len(seconds[c]))} if c in chains else {})})
    return {"machine": machine(), "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "inv_update_steps": precond.config.inv_update_steps_at(0, rows=precond.statistic_rows),
            "eigh_round_s": sum(seconds["eigh_fp32"]) / max(1, len(seconds["eigh_fp32"])),
            "loss_first_last": [losses[0], sum(losses[-20:]) / len(losses[-20:])], "rows": rows,
            "worst": {ch: [{"cosine": c, "step": st, "layer": ly} for c, st, ly in rows] for ch, rows in worst.items()}}


def audit(precond: KFACPreconditioner, grads: dict[str, torch.Tensor], chains: dict[str, RefreshMethod],
          bases: dict[str, dict[str, Decomposition]], cosines: dict[str, list[float]], counts: dict[str, list[int]],
          seconds: dict[str, list[float]], worst: Worst) -> None:
    """One decomposition: the FP64 reference, each chain's refresh from its own basis, the stale basis."""
    factors = {n: (f.value.float(), f.diagonal) for n, f in precond.factors().items() if f.value is not None}
    damping = precond.config.damping_at(precond.steps)
    exact = decompose_all(factors, method=ComputeMethod.EIGEN, damping=damping, compute_dtype=torch.float64,
                          out_dtype=torch.float64)
    ref = _precondition(precond, {n: d for n, d in exact.items() if d is not None}, grads)
    first = next(iter(chains))
    cosines["stale"] += _cosines(ref, _precondition(precond, bases[first], grads), worst=worst, chain="stale",
                                 step=precond.steps)
    for c, method in chains.items():
        start = time.perf_counter()
        fresh = decompose_all(factors, method=method, damping=damping, compute_dtype=torch.float32,
                              out_dtype=torch.float32, previous=bases[c])
        seconds[c].append(time.perf_counter() - start)
        report = method.report()
        counts[c] = [counts[c][0] + int(report["kept"]), counts[c][1] + int(report["refreshed"]),
                     counts[c][2] + int(report["exact"])]
        bases[c] = {n: d for n, d in fresh.items() if d is not None}
        cosines[c] += _cosines(ref, _precondition(precond, bases[c], grads), worst=worst, chain=c, step=precond.steps)


def report(res: dict[str, Any]) -> str:
    s = res["settings"]
    head = (f"BERT-{s['size']} batch {s['batch']}x{s['seq']}, {s['steps']} steps, decompositions every "
            f"{res['inv_update_steps']} steps, {'text ' + str(s['text']) if s['text'] else 'random tokens'}; loss "
            f"{res['loss_first_last'][0]:.3f} -> {res['loss_first_last'][1]:.3f}; per-layer cosine to the FP64-eigh "
            f"preconditioned gradient; eigh round {res['eigh_round_s']:.3f} s")
    cols = ["chain", "median_cosine", "p01_cosine", "min_cosine", "layer_decompositions", "kept", "refreshed",
            "exact", "round_s"]
    return "\n".join([head, machine_line(res["machine"]), "", table(res["rows"], cols)])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("refresh_accuracy", __doc__)
    p.add_argument("--size", default="mini", help="BERT size (default: %(default)s)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--windows", type=int, default=100, help="distinct batches of the text, cycled")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--chains", nargs="+", default=list(CHAINS), help="KEEP:EXACT[:STEPS] refresh settings to follow")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--text", type=Path)
    p.add_argument("--vocab", type=Path)
    args = p.parse_args(argv)
    if (args.text is None) != (args.vocab is None):
        p.error("--text and --vocab go together")
    res = measure(args)
    publish(res, report(res), args.out)
    return res


if __name__ == "__main__":
    main()
