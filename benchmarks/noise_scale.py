"""The gradient noise scale along a LAMB run: where is the critical batch of these models and this text?

``B_simple = tr(Σ)/|G|²`` (McCandlish et al. 2018) is measured with the library's
:class:`kaisa_ds.layers.noise_scale.NoiseScale` over every parameter, from the squared norms of each micro-batch's
gradient and of the accumulated step's (``--passes`` micro-batches of ``--batch`` sequences a step, so the two batch
sizes differ by the accumulation), every step, each term smoothed. A single process runs LAMB (kaisa_ds.optim's,
the pipeline's) on consecutive blocks of a text with bert_pretrain's masking; every ``--every`` steps it prints the
step, the training loss and the noise scale in sequences and in tokens, and at the end plots both against the step.
A batch far below ``B_simple`` is noise-limited: doubling it nearly halves the steps; far above it, a larger batch
buys almost nothing (the regime where a preconditioner is expected to pay).

    python -m benchmarks.noise_scale --text ../shared/data/wikitext-2/valid.txt \
        --vocab ../shared/data/bert-vocab/vocab.txt
    python -m benchmarks.noise_scale --size mini --steps 300 --text ... --vocab ...
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.accuracy import text_batches
from benchmarks.harness.cli import parser
from benchmarks.harness.machine import machine, machine_line
from benchmarks.harness.models import bert_for_pretraining, pretraining_loss
from benchmarks.harness.output import publish, table
from bert_pretrain.data.tokenizer import vocab_tokens
from kaisa_ds.layers.noise_scale import NoiseScale
from kaisa_ds.optim.select import build_lamb
from kaisa_ds.precondition.apply import fp32_norms


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = text_batches(args.text, args.vocab, batch=args.batch, seq=args.seq, count=args.steps * args.passes)
    model = bert_for_pretraining(args.size, vocab=len(set(vocab_tokens(args.vocab))), seq=args.seq)
    params = [p for p in model.parameters() if p.requires_grad]
    opt, _ = build_lamb(params, lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    noise = NoiseScale(params, smoothing=args.smoothing)
    rows = []
    for step in tqdm(range(args.steps), desc="steps", unit="step"):
        opt.zero_grad(set_to_none=True)
        noise.start()
        loss_sum = 0.0
        for i in range(args.passes):
            loss = pretraining_loss(model, batches[step * args.passes + i]) / args.passes
            loss.backward()
            loss_sum += loss.item()
        grad_sq = fp32_norms([p.grad for p in params if p.grad is not None]).square().sum()  # as K-FAC's step does
        noise.update(grad_sq, samples_per_pass=args.batch, passes=args.passes, world=1, grad_scale=1.0 / args.passes)
        opt.step()
        sched.step()
        if (step + 1) % args.every == 0:
            b = noise.b_simple()
            rows.append({"step": step + 1, "loss": loss_sum, "b_simple_sequences": b,
                         "b_simple_tokens": None if b is None else b * args.seq})
            tqdm.write(f"step {step + 1}: loss {loss_sum:.3f}, B_simple "
                       f"{'-' if b is None else f'{b:.0f} sequences ({b * args.seq:.0f} tokens)'}")
    return {"machine": machine(), "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "batch_tokens": args.batch * args.passes * args.seq, "rows": rows}


def report(res: dict[str, Any]) -> str:
    s = res["settings"]
    head = (f"BERT-{s['size']}, LAMB lr {s['lr']}, {s['passes']} passes of {s['batch']} x {s['seq']} tokens a step "
            f"({res['batch_tokens']} tokens), text {s['text']}; B_simple smoothed with {s['smoothing']}")
    return "\n".join([head, machine_line(res["machine"]), "",
                      table(res["rows"], ["step", "loss", "b_simple_sequences", "b_simple_tokens"])])


def plot(res: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in res["rows"] if r["b_simple_tokens"] is not None and r["b_simple_tokens"] > 0]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in rows], [r["b_simple_tokens"] for r in rows], label="B_simple (tokens)")
    ax.axhline(res["batch_tokens"], color="k", ls="--", lw=0.8, label="the batch (tokens per step)")
    ax.set(yscale="log", xlabel="step", ylabel="tokens", title=f"gradient noise scale, BERT-{res['settings']['size']}")
    twin = ax.twinx()
    twin.plot([r["step"] for r in res["rows"]], [r["loss"] for r in res["rows"]], color="tab:red", alpha=0.6,
              label="training loss")
    twin.set(ylabel="training loss")
    ax.legend(loc="upper left", fontsize=7)
    twin.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser("noise_scale", __doc__)
    p.add_argument("--size", default="tiny")
    p.add_argument("--batch", type=int, default=16, help="sequences per micro-batch")
    p.add_argument("--passes", type=int, default=4, help="micro-batches accumulated per step (needs >= 2)")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--smoothing", type=float, default=0.95)
    p.add_argument("--threads", type=int)
    p.add_argument("--text", type=Path, required=True)
    p.add_argument("--vocab", type=Path, required=True)
    args = p.parse_args(argv)
    if args.passes < 2:
        p.error("--passes must be at least 2: the noise scale compares a micro-batch's gradient with the step's")
    res = measure(args)
    publish(res, report(res), args.out)
    plot(res, args.out.with_suffix(".png"))
    return res


if __name__ == "__main__":
    main()
