"""One pretraining phase: prepare data, build the engine through kaisa_ds.initialize, train, evaluate, save."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from bert_pretrain.cli import build_parser
from bert_pretrain.data.documents import DataError
from bert_pretrain.data.prepare import PHASES, prepare_phase
from bert_pretrain.metrics import MetricsLog, plot_losses
from bert_pretrain.model import Losses, build_model, pretraining_losses

logger = logging.getLogger("bert_pretrain")


class Pretraining(nn.Module):
    """Wraps BertForPreTraining so ``engine(batch)`` returns the loss; keeps the last batch's statistics."""

    def __init__(self, bert: Any) -> None:
        super().__init__()
        self.bert_model = bert
        self.last: Losses | None = None

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.last = pretraining_losses(self.bert_model, batch)
        return self.last.loss


def init_distributed() -> tuple[int, int]:
    import deepspeed

    if "RANK" not in os.environ:  # a plain `python -m bert_pretrain`: a 1-rank group
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(port)})
    deepspeed.init_distributed(verbose=False)
    from deepspeed import comm as dist

    return dist.get_rank(), dist.get_world_size()


def sample_indices(n: int, *, step: int, micro: int, gas: int, micro_size: int, rank: int, world: int,
                   seed: int) -> list[int]:
    """The examples of one micro-batch: a fixed function of the step, so a resumed run sees the same data."""
    per_step = gas * world * micro_size
    start = step * per_step + (micro * world + rank) * micro_size
    out = []
    for k in range(start, start + micro_size):
        epoch, pos = divmod(k, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        out.append(int(perm[pos]))
    return out


def collate(dataset: Any, idx: list[int], device: torch.device) -> dict[str, torch.Tensor]:
    rows = dataset[idx]
    return {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in rows.items()}


def evaluate(module: Pretraining, heldout: Any, device: torch.device, *, examples: int, micro: int) -> dict[str, float]:
    module.eval()
    totals = torch.zeros(5, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, min(examples, len(heldout)), micro):
            idx = list(range(start, min(start + micro, examples, len(heldout))))
            r = pretraining_losses(module.bert_model, collate(heldout, idx, device))
            totals += torch.tensor([float(r.mlm) * float(r.mlm_count), float(r.mlm_count), float(r.mlm_correct),
                                    float(r.nsp_correct), r.nsp_count], dtype=torch.float64)
    module.train()
    return {"heldout_mlm_loss": float(totals[0] / totals[1]), "heldout_mlm_accuracy": float(totals[2] / totals[1]),
            "heldout_nsp_accuracy": float(totals[3] / totals[4])}


def _scheduler(cfg: dict[str, Any], max_steps: int) -> Any:
    from kaisa_ds.optim.poly_warmup import PolyWarmUpScheduler

    sched = cfg.pop("lr_schedule", None) or {"warmup_proportion": 0.1}
    warm, degree = float(sched.get("warmup_proportion", 0.1)), float(sched.get("degree", 0.5))
    return lambda opt: PolyWarmUpScheduler(opt, warmup_proportion=warm, total_steps=max_steps, degree=degree)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("DeepSpeed", "datasets"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        run(args)
    except DataError as exc:
        logger.error("%s", exc)
        return 2
    return 0


def run(args: Any) -> dict[str, Any]:
    from deepspeed import comm as dist

    import kaisa_ds
    from kaisa_ds.engine.ds_config import load_config

    rank, world = init_distributed()
    torch.manual_seed(args.seed)
    out: Path = args.output
    cache = args.data_cache or out.parent / "data"
    vocab = args.vocab
    if args.phase == 2 and args.init_checkpoint is not None and vocab is None:
        vocab = args.init_checkpoint / "vocab.txt"
    seq = PHASES[args.phase][0]
    folder = cache / f"phase{args.phase}"
    if rank == 0:
        folder = prepare_phase(list(args.data), cache, phase=args.phase, vocab=vocab, lower_case=not args.cased,
                               dupe_factor=args.dupe_factor, seed=args.seed)
    dist.barrier()
    from datasets import load_from_disk

    from bert_pretrain.data.tokenizer import load_tokenizer

    train_set, heldout = load_from_disk(str(folder / "train")), load_from_disk(str(folder / "heldout"))
    tok = load_tokenizer(cache / "vocab.txt", lower_case=not args.cased)
    source = str(args.init_checkpoint) if args.init_checkpoint else args.model_size
    bert = build_model(source, vocab_size=len(tok), max_positions=512)
    if seq > bert.config.max_position_embeddings:
        raise DataError(f"phase {args.phase} needs sequences of {seq} tokens but the model has only "
                        f"{bert.config.max_position_embeddings} positions")
    cfg = load_config(args.config)
    max_steps = args.max_steps or int((cfg.get("lr_schedule") or {}).get("total_steps", 0))
    if max_steps <= 0:
        raise DataError("--max-steps is required when the config has no lr_schedule.total_steps")
    micro = int(cfg.get("train_micro_batch_size_per_gpu", 8))
    global_batch = int(cfg.get("train_batch_size", micro * world))
    if len(train_set) < global_batch:
        raise DataError(f"--data: {len(train_set)} training examples are fewer than one global batch of "
                        f"{global_batch}; give more text or a smaller train_batch_size")
    module = Pretraining(bert)
    module.train()  # from_pretrained returns a model in eval mode (no dropout, and no K-FAC capture)
    engine, _, _, _ = kaisa_ds.initialize(model=module, model_parameters=module.parameters(), config=cfg,
                                          lr_scheduler=_scheduler(cfg, max_steps))
    gas = engine.gradient_accumulation_steps()
    start = 0
    ckpt_dir = out / "checkpoints"
    if args.resume and (ckpt_dir / "latest").is_file():
        _, client = engine.load_checkpoint(str(ckpt_dir))
        start = int(client["step"])
        logger.info("resumed from step %d", start)
    metrics = MetricsLog(out / "metrics.jsonl", enabled=rank == 0, resume_step=start if args.resume else None)
    bar = tqdm(total=max_steps, initial=start, desc=f"phase {args.phase}", disable=rank != 0)
    t_start, last = time.perf_counter(), {}
    for step in range(start, max_steps):
        t0 = time.perf_counter()
        total = torch.zeros(3)
        for m in range(gas):
            idx = sample_indices(len(train_set), step=step, micro=m, gas=gas, micro_size=micro, rank=rank,
                                 world=world, seed=args.seed)
            loss = engine(collate(train_set, idx, engine.device))
            engine.backward(loss)
            engine.step()
            stats = module.last
            assert stats is not None
            total += torch.tensor([float(loss), float(stats.mlm), float(stats.nsp)]) / gas
        dist.all_reduce(total)
        total /= world
        row: dict[str, Any] = {"step": step + 1, "loss": float(total[0]), "mlm_loss": float(total[1]),
                               "nsp_loss": float(total[2]), "lr": float(engine.get_lr()[0]),
                               "seq_per_s": global_batch / (time.perf_counter() - t0),
                               "loss_scale": float(getattr(engine.optimizer, "loss_scale", 1.0)),
                               "skipped_steps": int(engine.skipped_steps)}
        if not torch.isfinite(total).all() and not engine.fp16_enabled():
            raise FloatingPointError(f"non-finite loss {row['loss']} at step {step + 1}; lower the learning rate")
        if engine.kfac is not None:
            row["kfac_ms"] = {k: round(v * 1000, 3) for k, v in engine.kfac.timings.items()}
            row["kfac_skipped_windows"] = engine.kfac.skipped_windows
        if (step + 1) % args.eval_every == 0 or step + 1 == max_steps:
            row.update(evaluate(module, heldout, engine.device, examples=args.eval_examples, micro=micro))
        metrics.write(**row)
        last = row
        bar.update()
        bar.set_postfix(loss=f"{row['loss']:.3f}")
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < max_steps:
            engine.save_checkpoint(str(ckpt_dir), tag=f"step{step + 1}", client_state={"step": step + 1})
    bar.close()
    engine.save_checkpoint(str(ckpt_dir), tag=f"step{max_steps}", client_state={"step": max_steps})
    summary = {"phase": args.phase, "steps": max_steps, "resumed_from": start,
               "wall_seconds": time.perf_counter() - t_start, "final_train_loss": last.get("loss"),
               "heldout_mlm_loss": last.get("heldout_mlm_loss"),
               "heldout_mlm_accuracy": last.get("heldout_mlm_accuracy"),
               "heldout_nsp_accuracy": last.get("heldout_nsp_accuracy"), "kfac": engine.kfac is not None,
               "world_size": world, "global_batch": global_batch}
    if rank == 0:
        final = out / "final"
        module.bert_model.save_pretrained(str(final))
        tok.save_pretrained(str(final))
        (final / "vocab.txt").write_text((cache / "vocab.txt").read_text(encoding="utf-8"), encoding="utf-8")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        plot_losses(metrics.rows(), out / "loss.png", f"phase {args.phase}" + (" + K-FAC" if engine.kfac else ""))
        logger.info("phase %d done: %s", args.phase, json.dumps(summary))
    dist.barrier()
    return summary
