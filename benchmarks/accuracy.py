"""Accuracy lost by K-FAC's cheap settings against the exact ones: sampled factor statistics (a share of the
tokens, ``factor_sample_fraction``, or of an accumulation window's passes, ``factor_pass_fraction``) and
half-precision decompositions (``inv_dtype``), with the time each saves.

One BERT model with fixed weights sees ``--windows`` windows of ``--passes`` batches each (the loss averaged over
the passes, as DeepSpeed's accumulation does). Several preconditioners, one per variant
(``ROWS:INV_DTYPE[:PASSES]``, e.g. ``1:fp32:0.25`` for one pass in four), hang on the same model, so every variant
sees exactly the same activations and gradients; the first variant (``1:fp32``, exact) is the reference. After
each window every preconditioner commits its factors (running average, decay 0.95), decomposes them and
preconditions the same raw gradient.
Reported per variant, as medians over layers:
  factor error, one window     ‖F_sampled − F_full‖ / ‖F_full‖ of the first window's factors (A and G);
  factor error, running avg.   the same after ``--windows`` windows of the running average;
  preconditioned-gradient err. ‖P_sampled(∇) − P_full(∇)‖ / ‖P_full(∇)‖ after the last window, and the cosine;
  capture seconds              time inside the statistics hooks per factor step (median over windows);
  precondition seconds         time of the preconditioning stage per step (median over windows).

    python -m benchmarks.accuracy                                  # BERT-mini, batch 32 x 128, random tokens
    python -m benchmarks.accuracy --text ../shared/data/wikitext-2/valid.txt --vocab ../shared/data/bert-vocab/vocab.txt
    python -m benchmarks.accuracy --passes 4 --batch 8 --variants 1:fp32 1:fp32:0.5 1:fp32:0.25 0.25:fp32 ...
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.harness.batches import masked_batch, random_batch
from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from benchmarks.harness.output import publish, table
from benchmarks.harness.timing import median
from bert_pretrain.data.documents import WIKITEXT_MARKS
from bert_pretrain.data.errors import DataError
from bert_pretrain.data.examples import Specials
from bert_pretrain.data.tokenizer import MAX_UNK_RATE, check_coverage, check_vocab_size, load_tokenizer, vocab_tokens
from kaisa_ds.enums import Grafting
from kaisa_ds.plan.bert_sizes import KAISA_SKIP

VARIANTS = ("1:fp32", "0.5:fp32", "0.25:fp32", "0.125:fp32", "0.0625:fp32", "1:bf16", "0.25:bf16")


def parse_variant(text: str) -> tuple[float, str, float]:
    """``"0.25:bf16"`` → (0.25, "bf16", 1.0); ``"1:fp32:0.25"`` → (1.0, "fp32", 0.25) (rows, inv dtype, passes)."""
    fraction, _, rest = text.partition(":")
    dtype, _, passes = rest.partition(":")
    return float(fraction), dtype or "fp32", float(passes or 1)


def text_batches(text: Path, vocab: Path, *, batch: int, seq: int, count: int, seed: int = 0,
                 max_unk_rate: float = MAX_UNK_RATE) -> list[dict[str, torch.Tensor]]:
    """Consecutive windows of a real text in the pretraining loader's format (bert_pretrain's masking), read as
    bert_pretrain reads it: WikiText's `` @-@ `` marks undone, the tokenizer from the one helper that builds them,
    a vocabulary too small or a text mostly [UNK] under it refused (DataError naming the files)."""
    tok = load_tokenizer(vocab, lower_case=True, check_case=True)
    check_vocab_size(tok, source=f"--vocab {vocab}")
    raw = text.read_text(encoding="utf-8")
    ids = tok(WIKITEXT_MARKS.sub(r"\1", raw), add_special_tokens=False)["input_ids"]
    check_coverage(unknown=ids.count(tok.unk_token_id), total=len(ids), data=f"--text {text}",
                   source=f"--vocab {vocab}", max_unk_rate=max_unk_rate)
    width = seq - 2
    need = batch * width * count
    if len(ids) < need:
        raise ValueError(f"{text} has {len(ids)} tokens; {need} are needed for --windows {count}")
    specials = Specials.of(tok)
    rows = [ids[i:i + width] for i in range(0, need, width)]
    return [masked_batch(rows[w * batch:(w + 1) * batch], specials=specials, device="cpu", seed=seed + w)
            for w in range(count)]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from kaisa_ds import KFACPreconditioner

    torch.set_num_threads(args.threads or torch.get_num_threads())
    vocab_size = 30522
    if args.text:
        batches = text_batches(args.text, args.vocab, batch=args.batch, seq=args.seq,
                               count=args.windows * args.passes, max_unk_rate=args.max_unk_rate)
        vocab_size = len(set(vocab_tokens(args.vocab)))  # the tokenizer's size (load_tokenizer checks they agree)
    else:
        batches = [random_batch(args.batch, args.seq, vocab_size, "cpu", seed=i)
                   for i in range(args.windows * args.passes)]
    windows = [batches[w * args.passes:(w + 1) * args.passes] for w in range(args.windows)]
    device = torch.device(args.device)
    model = bert_for_pretraining(args.size, vocab=vocab_size, seq=args.seq).to(device)
    settings = {v: parse_variant(v) for v in args.variants}
    preconds = {v: KFACPreconditioner(model, factor_update_steps=1, inv_update_steps=1, damping=args.damping,
                                      kl_clip=None, grafting=Grafting.NONE, skip_layers=KAISA_SKIP,
                                      factor_sample_fraction=tokens,
                                      inv_dtype=inv_dtype, factor_pass_fraction=pass_share,
                                      accumulation_steps=args.passes)
                for v, (tokens, inv_dtype, pass_share) in settings.items()}
    first: dict[str, dict[str, torch.Tensor]] = {}
    capture: dict[str, list[float]] = {v: [] for v in args.variants}
    precondition: dict[str, list[float]] = {v: [] for v in args.variants}
    pre: dict[str, dict[str, torch.Tensor]] = {}
    watched = {f"{n}.weight" for n in next(iter(preconds.values())).layers}  # the preconditioned weights
    for window, passes in enumerate(tqdm(windows, desc="windows", unit="window")):
        model.zero_grad(set_to_none=True)
        for batch in passes:
            on_device = {k: v.to(device) for k, v in batch.items()}
            (pretraining_loss(model, on_device) / len(passes)).backward()
        raw = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        for f, precond in preconds.items():
            for n, p in model.named_parameters():  # every preconditioner sees the same raw gradient
                if n in raw:
                    p.grad = raw[n].clone()
            precond.step()
            capture[f].append(precond.timings["factor_capture"])
            precondition[f].append(precond.timings["preconditioning"])
            if window == 0:
                first[f] = {n: fac.value.float().clone() for n, fac in precond.factors().items()
                            if fac.value is not None and not fac.diagonal}
            pre[f] = {n: p.grad.clone() for n, p in model.named_parameters() if n in watched and p.grad is not None}
    final = {f: {n: fac.value.float() for n, fac in p.factors().items() if fac.value is not None and not fac.diagonal}
             for f, p in preconds.items()}
    ref = args.variants[0]
    rows = []
    for f in args.variants:
        cos = [float(torch.nn.functional.cosine_similarity(pre[f][n].flatten(), pre[ref][n].flatten(), dim=0))
               for n in pre[ref]]
        rows.append({
            "variant": f, "fraction": settings[f][0], "inv_dtype": settings[f][1], "pass_fraction": settings[f][2],
            "factor_err_one_window": median([_relative(first[f][n], first[ref][n]) for n in first[ref]]),
            "factor_err_running_avg": median([_relative(final[f][n], final[ref][n]) for n in final[ref]]),
            "precond_grad_err": median([_relative(pre[f][n], pre[ref][n]) for n in pre[ref]]),
            "precond_grad_cosine": median(cos),
            "capture_s": median(capture[f][1:] or capture[f]),
            "precondition_s": median(precondition[f][1:] or precondition[f]),
        })
    for key in ("capture", "precondition"):
        base = rows[0][f"{key}_s"]
        for row in rows:
            row[f"{key}_vs_exact"] = row[f"{key}_s"] / base if base else None
    return {"machine": machine(), "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "rows": rows}


def report(res: dict[str, Any]) -> str:
    s = res["settings"]
    head = (f"BERT-{s['size']} batch {s['batch']}x{s['seq']}, {s['windows']} windows of {s.get('passes', 1)} "
            "pass(es), "
            f"{'text ' + str(s['text']) if s['text'] else 'random tokens'}; medians over layers")
    cols = ["variant", "factor_err_one_window", "factor_err_running_avg", "precond_grad_err", "precond_grad_cosine",
            "capture_s", "capture_vs_exact", "precondition_s", "precondition_vs_exact"]
    return "\n".join([head, machine_line(res["machine"]), "", table(res["rows"], cols)])


def plot(res: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, tx) = plt.subplots(1, 2, figsize=(10, 4))
    fp32 = [r for r in res["rows"] if r["inv_dtype"] == "fp32"]
    kinds = {"tokens (factor_sample_fraction)": [r for r in fp32 if r.get("pass_fraction", 1.0) == 1.0],
             "passes (factor_pass_fraction)": [r for r in fp32 if r["fraction"] == 1.0]}
    for kind, rows in kinds.items():
        rows = sorted(rows, key=lambda r: r["fraction"] * r.get("pass_fraction", 1.0))
        share = [r["fraction"] * r.get("pass_fraction", 1.0) for r in rows]
        if len(rows) < 2:
            continue
        for key, label, mark in (("factor_err_one_window", "factor, one window", "o"),
                                 ("factor_err_running_avg", "factor, running average", "^"),
                                 ("precond_grad_err", "preconditioned gradient", "s")):
            sub = [(x, r[key]) for x, r in zip(share, rows) if r[key] > 0]
            ax.plot(*zip(*sub), f"{mark}-" if kind.startswith("tokens") else f"{mark}--", label=f"{label}, {kind}")
        tx.plot(share, [r["capture_vs_exact"] for r in rows], "s-" if kind.startswith("tokens") else "s--", label=kind)
    ax.set(xscale="log", yscale="log", xlabel="share of the window's tokens used",
           ylabel="relative error vs. full statistics", title="accuracy lost by sampling")
    ax.legend(fontsize=6)
    tx.set(xscale="log", xlabel="share of the window's tokens used", ylabel="statistics time / full",
           title="time kept")
    tx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("accuracy", __doc__)
    p.add_argument("--size", default="mini", help="BERT size (default: %(default)s)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--windows", type=int, default=10, help="factor windows seen (default: %(default)s)")
    p.add_argument("--passes", type=int, default=1,
                   help="batches accumulated per window (default: %(default)s); pass subsets need more than 1")
    p.add_argument("--damping", type=float, default=0.001)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS),
                   help="ROWS:INV_DTYPE[:PASSES] settings to compare (token share, decomposition dtype, share of "
                        "the window's passes); the first, 1:fp32, is the reference (default: %(default)s)")
    p.add_argument("--text", type=Path, help="a text file to take the tokens from (default: random tokens)")
    p.add_argument("--vocab", type=Path, help="the BERT vocab.txt for --text (only with --text)")
    p.add_argument("--max-unk-rate", type=float, default=MAX_UNK_RATE,
                   help="largest share of [UNK] tokens --text may have under --vocab (default: %(default)s)")
    p.add_argument("--threads", type=int, help="torch threads")
    p.add_argument("--device", default="cpu", help="where the model and the preconditioners run, e.g. cuda "
                   "(default: %(default)s; the times are then host-side, not synchronised)")
    args = p.parse_args(argv)
    try:
        parsed = [parse_variant(v) for v in args.variants]
    except ValueError:
        p.error(f"--variants must look like 0.25:bf16 or 1:fp32:0.25, got {args.variants}")
    if parsed[0] != (1.0, "fp32", 1.0):
        p.error("--variants must start with 1:fp32, the exact reference")
    if args.text and not args.vocab:
        p.error("--text needs --vocab")
    if args.vocab and not args.text:
        p.error("--vocab without --text: the vocabulary is used only to tokenise --text (without it the batches "
                "are random token ids over BERT's 30,522); give --text too, or leave --vocab out")
    try:
        res = measure(args)
    except DataError as exc:
        p.error(str(exc))
    publish(res, report(res), args.out)  # creates the output folder the plot goes to
    plot(res, args.out.with_suffix(".png"))
    return res


if __name__ == "__main__":
    main()
