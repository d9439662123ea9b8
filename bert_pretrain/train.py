"""One pretraining phase: prepare data, build the engine through kaisa_ds.initialize, train, evaluate, save.

Every rank runs this. Rank 0 prepares the data (once; reused afterwards) while the others wait, and any data
error is sent to every rank so they all stop with the same message.
"""

from __future__ import annotations

import json
import logging
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bert_pretrain import checkpoints, eval_sets
from bert_pretrain.cli import build_parser
from bert_pretrain.curves import resumed_elapsed
from bert_pretrain.data.documents import DataError
from bert_pretrain.data.loader import MicroBatches, check_enough_examples, load_split, to_device
from bert_pretrain.data.prepare import PHASES, prepare_phase
from bert_pretrain.data.tokenizer import load_tokenizer
from bert_pretrain.evaluation import evaluate, most_frequent_target
from bert_pretrain.metrics import MetricsLog, plot_losses
from bert_pretrain.model import STATS, PretrainingLoss, build_model, check_positions
from kaisa_ds.engine.launch import init_distributed

logger = logging.getLogger("bert_pretrain")


def prepare_on_rank0(args: Namespace, cache: Path, rank: int) -> Path:
    """Rank 0 prepares (or reuses) the phase's data; every rank gets the folder, or the same DataError."""
    import torch.distributed as tdist

    outcome: list[Any] = [None]
    if rank == 0:
        try:
            texts = args.data or [write_builtin_corpus(cache, seed=args.seed, articles=args.articles)]
            vocab = args.vocab
            if vocab is None and args.init_checkpoint is not None and (args.init_checkpoint / "vocab.txt").is_file():
                vocab = args.init_checkpoint / "vocab.txt"
            outcome[0] = str(prepare_phase(
                list(texts), cache, phase=args.phase, vocab=vocab, lower_case=not args.cased,
                dupe_factor=args.dupe_factor, seed=args.seed, max_seq_length=args.max_seq_length,
                max_predictions=args.max_predictions, doc_split=args.doc_split, vocab_size=args.vocab_size))
        except DataError as exc:
            outcome[0] = exc
    tdist.broadcast_object_list(outcome, src=0)
    if isinstance(outcome[0], DataError):
        raise outcome[0]
    return Path(outcome[0])


def write_builtin_corpus(cache: Path, *, seed: int, articles: int) -> Path:
    from bert_pretrain.corpus import generate_corpus

    path = cache / f"builtin_corpus_seed{seed}_{articles}.txt"
    if not path.is_file():
        generate_corpus(seed=seed, num_articles=articles).write_text(path)
    return path


def engine_config(path: Path, max_steps: int | None) -> tuple[dict[str, Any], int]:
    """The DeepSpeed config with the schedule's total_steps set to the steps of this run."""
    from kaisa_ds.engine.ds_config import load_config

    cfg = load_config(path)
    schedule = cfg.get("lr_schedule")
    steps = max_steps or int((schedule or {}).get("total_steps", 0))
    if steps <= 0:
        raise DataError(f"--max-steps is needed: {path} has no lr_schedule.total_steps")
    if isinstance(schedule, dict):
        schedule["total_steps"] = steps
    return cfg, steps


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("DeepSpeed", "datasets", "kaisa_ds"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        summary = run(args)
    except DataError as exc:
        logger.error("%s", exc)
        return 2
    except FloatingPointError as exc:  # every rank sees the same reduced loss, so all stop here
        logger.error("%s", exc)
        return 3
    if summary.get("rank", 0) == 0 and "stopped_at" not in summary:
        print(f"bert_pretrain phase {args.phase}: {json.dumps({k: v for k, v in summary.items() if k != 'rank'})}")
    return 0


def run(args: Namespace) -> dict[str, Any]:
    """Train one phase; returns the summary (also written to <output>/summary.json)."""
    import kaisa_ds

    rank, world = init_distributed()
    out: Path = args.output
    cache = args.data_cache or out.parent / "data"
    folder = prepare_on_rank0(args, cache, rank)
    train_set, heldout = load_split(folder, "train"), load_split(folder, "heldout")
    extra_eval = eval_sets.prepare_on_rank0(args, cache, rank)  # --eval-data: evaluated instead of heldout
    tok = load_tokenizer(cache / "vocab.txt", lower_case=not args.cased)
    seq = args.max_seq_length or PHASES[args.phase][0]
    torch.manual_seed(args.seed)
    source = args.init_checkpoint or args.model_size
    bert = build_model(source, vocab_size=len(tok), max_positions=max(512, seq))
    check_positions(bert, seq, source=f"--init-checkpoint/--model-size {source}")
    torch.manual_seed(args.seed + 1000 * rank)  # the same weights everywhere, different dropout masks per rank
    cfg, max_steps = engine_config(args.config, args.max_steps)
    module = PretrainingLoss(bert)
    engine, _, _, _ = kaisa_ds.initialize(model=module, model_parameters=module.parameters(), config=cfg)
    micro, gas, global_batch = (engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(),
                                engine.train_batch_size())
    check_enough_examples(len(train_set), global_batch=global_batch, world=world, folder=folder)
    ckpt_dir = out / "checkpoints"
    start, consumed = checkpoints.load_latest(engine, ckpt_dir, rank=rank) if args.resume else (0, 0)
    batches = iter(MicroBatches(train_set, micro_batch=micro, seed=args.seed, rank=rank, world=world,
                                consumed=consumed))
    metrics = MetricsLog(out / "metrics.jsonl", enabled=rank == 0, resume_step=start if args.resume else None)
    baseline = most_frequent_target(train_set)
    stop = min(max_steps, start + args.stop_after) if args.stop_after else max_steps
    bar = tqdm(total=max_steps, initial=start, desc=f"phase {args.phase}", unit="step", disable=rank != 0)
    t_start, last = time.perf_counter(), {}
    elapsed = resumed_elapsed(out / "metrics.jsonl", start) if args.resume and rank == 0 else 0.0  # rank 0 logs
    for step in range(start + 1, stop + 1):
        t_step = time.perf_counter()
        row = train_step(engine, module, batches, step=step, world=world, gas=gas, global_batch=global_batch)
        elapsed += time.perf_counter() - t_step
        row["elapsed_s"] = round(elapsed, 4)  # training time only: evaluation and saving are not counted
        consumed += gas
        if step % args.eval_every == 0 or step == max_steps:
            for name, data in (extra_eval or {"": heldout}).items():
                result = evaluate(module, data, device=engine.device, examples=args.eval_examples,
                                  micro_batch=micro, rank=rank, world=world, baseline_token=baseline)
                row.update(eval_sets.renamed(result, name) if name else result)
        metrics.write(row, engine=engine)
        last = row
        bar.update()
        bar.set_postfix(loss=f"{row['loss']:.3f}")
        if (args.save_every and step % args.save_every == 0) or step == max_steps:
            checkpoints.save(engine, ckpt_dir, step=step, consumed=consumed, rank=rank, keep=args.keep_checkpoints)
    bar.close()
    if stop < max_steps:
        logger.warning("stopped after step %d of %d (--stop-after); continue with --resume", stop, max_steps)
        return {"stopped_at": stop, "rank": rank}
    summary = {"phase": args.phase, "steps": max_steps, "resumed_from": start,
               "wall_seconds": round(time.perf_counter() - t_start, 2), "world_size": world,
               "global_batch": global_batch, "kfac": engine.kfac is not None, "final_train_loss": last.get("loss"),
               **{k: v for k, v in last.items() if k.startswith("heldout_")}, "rank": rank}
    if rank == 0:
        save_final(module, tok, cache / "vocab.txt", out / "final")
        (out / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "rank"}, indent=1))
        plot_losses(metrics.rows(), out / "loss.png", f"phase {args.phase}" + (" + K-FAC" if engine.kfac else ""))
    return summary


def train_step(engine: Any, module: PretrainingLoss, batches: Any, *, step: int, world: int, gas: int,
               global_batch: int) -> dict[str, Any]:
    """One optimizer step of ``gas`` micro-batches; the statistics are reduced over ranks once, at the end."""
    from deepspeed import comm as dist

    t0 = time.perf_counter()
    lr = float(engine.get_lr()[0])  # the rate this step's update uses (the scheduler moves on in engine.step)
    totals = torch.zeros(len(STATS), device=engine.device)
    for _ in range(gas):
        loss = engine(to_device(next(batches), engine.device))
        engine.backward(loss)
        engine.step()
        assert module.last is not None
        totals += module.last
    dist.all_reduce(totals)
    stats = dict(zip(STATS, totals.tolist()))
    row: dict[str, Any] = {"step": step, "loss": stats["loss"] / (gas * world),
                           "mlm_loss": stats["mlm_loss"] / (gas * world), "nsp_loss": stats["nsp_loss"] / (gas * world),
                           "mlm_accuracy": stats["mlm_correct"] / stats["mlm_count"],
                           "nsp_accuracy": stats["nsp_correct"] / stats["nsp_count"],
                           "lr": lr, "seq_per_s": global_batch / (time.perf_counter() - t0),
                           "loss_scale": float(getattr(engine.optimizer, "loss_scale", 1.0)),
                           "skipped_steps": int(engine.skipped_steps)}
    if not torch.isfinite(totals[:3]).all() and not engine.fp16_enabled():
        raise FloatingPointError(f"non-finite loss {row['loss']} at step {step}; lower the learning rate in the "
                                 "config or check the data")
    if engine.kfac is not None:
        row["kfac_ms"] = {k: round(v * 1000, 3) for k, v in engine.kfac.timings.items()}
        row["kfac_skipped_windows"] = int(engine.kfac.skipped_windows)
    return row


def save_final(module: PretrainingLoss, tok: Any, vocab: Path, folder: Path) -> None:
    """The HF model and tokenizer (with vocab.txt) for phase 2 and SQuAD fine-tuning."""
    module.bert_model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    (folder / "vocab.txt").write_bytes(vocab.read_bytes())
