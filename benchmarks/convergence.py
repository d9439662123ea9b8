"""Convergence benchmark: phase-1 style BERT pretraining (MLM + NSP) on WikiText-2, LAMB vs. LAMB + K-FAC.

Same seed, data order and schedule for both. LAMB's learning rate and K-FAC's damping come from a small sweep
that is recorded in the output. Reports held-out MLM loss curves, and the steps and wall time K-FAC needs to
reach LAMB's final held-out MLM loss.

    # the recorded run (BERT-mini, ~75 minutes on 2 CPU cores with the sweep; see benchmarks/README.md)
    python -m benchmarks.convergence --model-size mini --seq 64 --batch 32 --steps 600 --sweep-steps 100 \
        --factor-every 2 --inv-every 10
    python -m benchmarks.convergence --model-size small --seq 64 --steps 800  # a smaller, faster variant
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

DEFAULT_TEXT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext-2" / "valid.txt"
DEFAULT_VOCAB = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bert-vocab" / "vocab.txt"
SIZES = {"small": (128, 2, 2, 512), "mini": (256, 4, 4, 1024)}  # hidden, layers, heads, intermediate
logger = logging.getLogger("benchmarks.convergence")


@dataclass
class Batch:
    ids: torch.Tensor
    types: torch.Tensor
    labels: torch.Tensor  # -100 where not masked
    nsp: torch.Tensor


def tokenize(text_path: Path, vocab_path: Path) -> tuple[torch.Tensor, Any]:
    """WikiText-2 as one stream of real-vocabulary WordPiece ids (headings and blank lines dropped)."""
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]

    for p in (text_path, vocab_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found: pass --text/--vocab (see ../shared/data/README.md)")
    tok = BertTokenizerFast(vocab=str(vocab_path), do_lower_case=True)
    if len(tok) < 1000:
        raise ValueError(f"{vocab_path} loaded only {len(tok)} tokens; is it a BERT vocab.txt?")
    lines = [ln.strip() for ln in text_path.read_text(encoding="utf-8").splitlines()]
    body = " ".join(ln for ln in lines if ln and not ln.startswith("="))
    return torch.tensor(tok(body, add_special_tokens=False)["input_ids"]), tok


def make_batch(stream: torch.Tensor, starts: torch.Tensor, seq: int, tok: Any, gen: torch.Generator) -> Batch:
    """[CLS] A [SEP] B [SEP] pairs, B the next segment or (50%) a random one; BERT's 15% 80/10/10 masking."""
    half = (seq - 3) // 2
    n = len(starts)
    a = torch.stack([stream[s:s + half] for s in starts.tolist()])
    is_random = torch.rand(n, generator=gen) < 0.5
    rand_starts = torch.randint(0, len(stream) - half, (n,), generator=gen)
    b_starts = torch.where(is_random, rand_starts, starts + half)
    b = torch.stack([stream[s:s + half] for s in b_starts.tolist()])
    cls, sep = torch.full((n, 1), tok.cls_token_id), torch.full((n, 1), tok.sep_token_id)
    ids = torch.cat([cls, a, sep, b, sep], 1)
    types = torch.cat([torch.zeros(n, half + 2, dtype=torch.long), torch.ones(n, half + 1, dtype=torch.long)], 1)
    special = (ids == tok.cls_token_id) | (ids == tok.sep_token_id)
    chosen = (torch.rand(ids.shape, generator=gen) < 0.15) & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    r = torch.rand(ids.shape, generator=gen)
    masked = ids.clone()
    masked[chosen & (r < 0.8)] = tok.mask_token_id
    rand_tok = torch.randint(1000, len(tok), ids.shape, generator=gen)
    swap = chosen & (r >= 0.8) & (r < 0.9)
    masked[swap] = rand_tok[swap]
    return Batch(masked, types, labels, is_random.long())


def losses(model: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """MLM loss (decoder applied only at masked positions) and NSP loss."""
    out = model.bert(input_ids=batch.ids, token_type_ids=batch.types)
    seq, pooled = out.last_hidden_state, out.pooler_output
    where = batch.labels != -100
    logits = model.cls.predictions(seq[where])
    mlm = F.cross_entropy(logits, batch.labels[where])
    nsp = F.cross_entropy(model.cls.seq_relationship(pooled), batch.nsp)
    return mlm, nsp


def run(args: argparse.Namespace, stream: torch.Tensor, held: Batch, tok: Any, *, lr: float, damping: float | None,
        steps: int, label: str) -> dict[str, Any]:
    from transformers import BertConfig, BertForPreTraining

    from kaisa_ds import KFACPreconditioner
    from kaisa_ds.optim.lamb import Lamb
    from kaisa_ds.optim.poly_warmup import PolyWarmUpScheduler
    from kaisa_ds.optim.select import lamb_param_groups

    hidden, layers, heads, inter = SIZES[args.model_size]
    torch.manual_seed(args.seed)
    model = BertForPreTraining(BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                                          num_attention_heads=heads, intermediate_size=inter,
                                          max_position_embeddings=max(512, args.seq)))
    opt = Lamb(lamb_param_groups(model, weight_decay=0.01), lr=lr)
    sched = PolyWarmUpScheduler(opt, warmup_proportion=args.warmup, total_steps=steps)
    kfac = None
    if damping is not None:
        kfac = KFACPreconditioner(model, factor_update_steps=args.factor_every, inv_update_steps=args.inv_every,
                                  damping=damping, kl_clip=0.001, lr=lambda _s: sched.get_last_lr()[0],
                                  skip_layers=["embeddings", "cls", "pooler"])
    gen = torch.Generator().manual_seed(args.seed + 1)  # same data order for every run
    curve, train_seconds = [], 0.0
    for step in tqdm(range(steps), desc=label, leave=False):
        starts = torch.randint(0, len(stream) - args.seq, (args.batch,), generator=gen)
        batch = make_batch(stream, starts, args.seq, tok, gen)
        t0 = time.perf_counter()
        mlm, nsp = losses(model, batch)
        opt.zero_grad()
        (mlm + nsp).backward()
        if kfac is not None:
            kfac.step()
        opt.step()
        sched.step()
        train_seconds += time.perf_counter() - t0
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            model.eval()
            with torch.no_grad():
                h_mlm, _ = losses(model, held)
            model.train()
            curve.append({"step": step + 1, "seconds": train_seconds, "heldout_mlm": float(h_mlm),
                          "train_loss": float((mlm + nsp).detach())})
    return {"label": label, "lr": lr, "damping": damping, "curve": curve, "train_seconds": train_seconds}


def first_reaching(curve: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    return next((p for p in curve if p["heldout_mlm"] <= target), None)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in (results["lamb"], results["kfac"]):
        xs = [p["step"] for p in r["curve"]]
        ax1.plot(xs, [p["heldout_mlm"] for p in r["curve"]], label=r["label"])
        ax2.plot([p["seconds"] for p in r["curve"]], [p["heldout_mlm"] for p in r["curve"]], label=r["label"])
    target = results["lamb"]["curve"][-1]["heldout_mlm"]
    for ax, xl in ((ax1, "step"), (ax2, "training seconds")):
        ax.axhline(target, color="grey", ls=":", label="LAMB final")
        ax.set_xlabel(xl)
        ax.set_ylabel("held-out MLM loss")
        ax.legend()
    fig.suptitle(f"BERT-{results['settings']['model_size']} phase-1 on WikiText-2: LAMB vs LAMB + K-FAC")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-size", choices=sorted(SIZES), default="small")
    p.add_argument("--steps", type=int, default=800, help="optimizer steps of each final run")
    p.add_argument("--sweep-steps", type=int, default=150, help="steps of each sweep run (0: no sweep)")
    p.add_argument("--lr-grid", type=float, nargs="+", default=[5e-3, 1e-2, 2e-2], help="LAMB learning rates")
    p.add_argument("--damping-grid", type=float, nargs="+", default=[1e-3, 1e-2], help="K-FAC dampings")
    p.add_argument("--kfac-lr-scales", type=float, nargs="+", default=[1.0, 2.0],
                   help="K-FAC's sweep also tries LAMB's chosen lr times each of these (each optimizer gets its lr)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--warmup", type=float, default=0.1, help="warmup proportion of the poly schedule")
    p.add_argument("--factor-every", type=int, default=1, help="K-FAC factor_update_steps")
    p.add_argument("--inv-every", type=int, default=10, help="K-FAC inv_update_steps")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    p.add_argument("--vocab", type=Path, default=DEFAULT_VOCAB)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "convergence.json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    stream, tok = tokenize(args.text, args.vocab)
    cut = int(len(stream) * 0.9)
    train_stream, held_stream = stream[:cut], stream[cut:]
    hg = torch.Generator().manual_seed(12345)
    held = make_batch(held_stream, torch.randint(0, len(held_stream) - args.seq, (128,), generator=hg), args.seq,
                      tok, hg)
    sweep: list[dict[str, Any]] = []
    lr, damping = args.lr_grid[0], args.damping_grid[0]
    if args.sweep_steps > 0:
        for cand in args.lr_grid:
            r = run(args, train_stream, held, tok, lr=cand, damping=None, steps=args.sweep_steps, label=f"lr {cand}")
            sweep.append({"kind": "lamb_lr", "lr": cand, "heldout_mlm": r["curve"][-1]["heldout_mlm"]})
        lr = min((s for s in sweep if s["kind"] == "lamb_lr"), key=lambda s: s["heldout_mlm"])["lr"]
        for scale in args.kfac_lr_scales:
            for cand in args.damping_grid:
                r = run(args, train_stream, held, tok, lr=lr * scale, damping=cand, steps=args.sweep_steps,
                        label=f"damping {cand}, lr {lr * scale:g}")
                sweep.append({"kind": "kfac_damping", "lr": lr * scale, "damping": cand,
                              "heldout_mlm": r["curve"][-1]["heldout_mlm"]})
        best = min((s for s in sweep if s["kind"] == "kfac_damping"), key=lambda s: s["heldout_mlm"])
        damping, kfac_lr = best["damping"], best["lr"]
    else:
        kfac_lr = lr
    lamb = run(args, train_stream, held, tok, lr=lr, damping=None, steps=args.steps, label="LAMB")
    kfac = run(args, train_stream, held, tok, lr=kfac_lr, damping=damping, steps=args.steps, label="LAMB + K-FAC")
    target = lamb["curve"][-1]["heldout_mlm"]
    hit = first_reaching(kfac["curve"], target)
    summary = {
        "lamb_final_heldout_mlm": target, "kfac_final_heldout_mlm": kfac["curve"][-1]["heldout_mlm"],
        "kfac_steps_to_lamb_final": hit["step"] if hit else None,
        "kfac_step_ratio": hit["step"] / args.steps if hit else None,
        "kfac_seconds_to_lamb_final": hit["seconds"] if hit else None,
        "lamb_seconds": lamb["train_seconds"], "kfac_seconds": kfac["train_seconds"],
        "kfac_time_ratio": hit["seconds"] / lamb["train_seconds"] if hit else None,
    }
    results = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                           "torch": torch.__version__}, "date": date.today().isoformat(), "sweep": sweep,
               "chosen": {"lr": lr, "damping": damping, "kfac_lr": kfac_lr}, "lamb": lamb, "kfac": kfac,
               "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    plot(results, args.out.with_suffix(".png"))
    print(f"{'run':<14}{'final held-out MLM':>20}{'train s':>10}")
    for r in (lamb, kfac):
        print(f"{r['label']:<14}{r['curve'][-1]['heldout_mlm']:>20.4f}{r['train_seconds']:>10.0f}")
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
