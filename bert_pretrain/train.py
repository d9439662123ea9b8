"""One pretraining phase: prepare data, build the engine through kaisa_ds.initialize, train, evaluate, save.

Every rank runs this. Rank 0 prepares the data (once; reused afterwards) while the others wait, and any data
error is sent to every rank so they all stop with the same message.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bert_pretrain import checkpoints, eval_sets, faults
from bert_pretrain.checkpoints import CheckpointError
from bert_pretrain.cli import ARTICLES, MODEL_SIZE, VOCAB_SIZE, build_parser
from bert_pretrain.curves import resumed_elapsed
from bert_pretrain.data.documents import DataError
from bert_pretrain.data.loader import MicroBatches, check_enough_examples, load_split, to_device
from bert_pretrain.data.prepare import PHASES, input_fingerprint, prepare_phase, read_coverage, unk_share
from bert_pretrain.data.tokenizer import load_tokenizer, vocab_digest
from bert_pretrain.evaluation import evaluate, most_frequent_target
from bert_pretrain.intervals import interval_warnings
from bert_pretrain.metrics import plot_losses, send_to_monitor
from bert_pretrain.model import STATS, PretrainingLoss, build_model, check_positions
from bert_pretrain.pins import check_pins, data_pins
from bert_pretrain.preflight import check_args, check_fresh_output, finished_summary, given_vocab
from kaisa_ds.checkpoint.atomic import write_atomic
from kaisa_ds.engine.launch import init_distributed
from kaisa_ds.engine.noise_probe import EngineNoiseProbe
from kaisa_ds.report.metrics_log import MetricsError, MetricsLog

logger = logging.getLogger("bert_pretrain")
PIPELINE_ERRORS = (DataError, CheckpointError, MetricsError)


def on_rank0(fn: Callable[[], Any]) -> Any:
    """``fn()`` on rank 0, its result broadcast to every rank; a pipeline error raised there is raised on every
    rank, so all stop with the same message instead of waiting for rank 0 forever."""
    import torch.distributed as tdist

    outcome: list[Any] = [None]
    if tdist.get_rank() == 0:
        try:
            outcome[0] = fn()
        except PIPELINE_ERRORS as exc:
            outcome[0] = exc
    tdist.broadcast_object_list(outcome, src=0)
    if isinstance(outcome[0], PIPELINE_ERRORS):
        raise outcome[0]
    return outcome[0]


def plan_start(args: Namespace, out: Path, *, world: int, max_steps: int) -> dict[str, Any]:
    """Rank 0's decision before any work: ``{"finished": summary}`` for a finished run that --resume must leave
    alone, else ``{"resume": checkpoint or None}``, the newest intact checkpoint to continue from."""
    ckpt_dir = out / "checkpoints"
    if not args.resume:
        check_fresh_output(out, overwrite=args.overwrite)
        return {"resume": None}
    summary = finished_summary(out, max_steps=max_steps)
    if summary is not None:
        return {"finished": summary}
    chosen = checkpoints.newest_intact(ckpt_dir, world=world)
    if chosen is None:
        logger.warning("--resume: no checkpoint in %s yet; starting from step 0", ckpt_dir)
    return {"resume": chosen}


def prepare_data(args: Namespace, cache: Path, chosen: checkpoints.Intact | None) -> tuple[Path, dict[str, Any]]:
    """Prepare (or reuse) the phase's data; a resume uses the vocabulary pinned in its checkpoint and refuses
    data that differs from what the checkpoint was trained on. Returns the folder and its pins."""
    texts = args.data or [write_builtin_corpus(cache, seed=args.seed, articles=args.articles or ARTICLES)]
    given = given_vocab(args)
    vocab = given[0] if given is not None else None
    if chosen is not None:
        check_pins(chosen.pins, {**chosen.pins, "inputs": input_fingerprint(
            list(texts), text_column=args.text_column, data_split=args.data_split)}, checkpoint=chosen.folder)
        pinned = chosen.folder / checkpoints.VOCAB
        if vocab is not None and vocab_digest(vocab) != vocab_digest(pinned):
            raise DataError(f"--resume: --vocab {vocab} differs from {pinned}, the vocabulary {chosen.folder} was "
                            "trained with; leave --vocab out (the checkpoint's is reused) or start a new run")
        vocab = pinned  # never retrain: the token ids must stay those of the checkpoint
    folder = prepare_phase(
        list(texts), cache, phase=args.phase, vocab=vocab, lower_case=not args.cased, dupe_factor=args.dupe_factor,
        seed=args.seed, max_seq_length=args.max_seq_length, max_predictions=args.max_predictions,
        doc_split=args.doc_split, vocab_size=args.vocab_size or VOCAB_SIZE, encoding=args.encoding,
        max_unk_rate=args.max_unk_rate, text_column=args.text_column, data_split=args.data_split)
    current = data_pins(folder)
    if chosen is not None:
        check_pins(chosen.pins, current, checkpoint=chosen.folder)
    return folder, current


def write_builtin_corpus(cache: Path, *, seed: int, articles: int) -> Path:
    from bert_pretrain.corpus import generate_corpus

    path = cache / f"builtin_corpus_seed{seed}_{articles}.txt"
    if not path.is_file():
        generate_corpus(seed=seed, num_articles=articles).write_text(path)
    return path


def engine_config(path: Path, max_steps: int | None) -> tuple[dict[str, Any], int]:
    """The DeepSpeed config with the schedule's total_steps set to the steps of this run."""
    from kaisa_ds.engine.ds_config import load_config

    try:
        cfg = load_config(path)
    except (ValueError, OSError) as exc:  # a binary file raises UnicodeDecodeError, which names no file
        raise DataError(f"--config {path}: not a readable JSON config ({exc}); give a DeepSpeed JSON file such as "
                        "ds_configs/bert_tiny_phase1.json") from exc
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
    except (DataError, MetricsError) as exc:
        logger.error("%s", exc)
        return 2
    except FloatingPointError as exc:  # every rank sees the same reduced loss, so all stop here
        logger.error("%s", exc)
        return 3
    except CheckpointError as exc:
        logger.error("%s", exc)
        return 4
    finally:
        _leave_process_group()
    if summary.get("rank", 0) == 0 and "stopped_at" not in summary:
        print(f"bert_pretrain phase {args.phase}: {json.dumps({k: v for k, v in summary.items() if k != 'rank'})}")
    return 0


def _leave_process_group() -> None:
    """Tear down torch.distributed before exit: left to interpreter shutdown, gloo's threads can abort the
    process ("terminate called without an active exception", exit -6) and hide the real exit code."""
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


def run(args: Namespace) -> dict[str, Any]:
    """Train one phase; returns the summary (also written to <output>/summary.json)."""
    import kaisa_ds

    check_args(args)  # before anything heavy: a wrong path fails in seconds
    cfg, max_steps = engine_config(args.config, args.max_steps)
    rank, world = init_distributed()
    if rank == 0:  # a kfac interval as long as the run: one update from step 0 serves every step (issue 21)
        interval_warnings(cfg, steps=max_steps, source=f"--config {args.config}")
    out: Path = args.output
    cache = args.data_cache or out.parent / "data"
    plan = on_rank0(lambda: plan_start(args, out, world=world, max_steps=max_steps))
    if "finished" in plan:
        logger.warning("--resume: %s already finished its %d steps; nothing to do, its results are kept", out,
                       max_steps)
        return {**plan["finished"], "already_finished": True, "rank": rank}
    chosen: checkpoints.Intact | None = plan["resume"]
    folder, pins = on_rank0(lambda: prepare_data(args, cache, chosen))
    train_set, heldout = load_split(folder, "train"), load_split(folder, "heldout")
    extra_eval = eval_sets.prepare_on_rank0(args, cache, rank)  # --eval-data: evaluated instead of heldout
    tok = load_tokenizer(cache / "vocab.txt", lower_case=not args.cased)
    seq = args.max_seq_length or PHASES[args.phase][0]
    torch.manual_seed(args.seed)
    size = args.model_size or MODEL_SIZE
    flag = f"--init-checkpoint {args.init_checkpoint}" if args.init_checkpoint else f"--model-size {size}"
    bert = build_model(args.init_checkpoint or size, vocab_size=len(tok), max_positions=max(512, seq), flag=flag)
    check_positions(bert, seq, source=flag)
    torch.manual_seed(args.seed + 1000 * rank)  # the same weights everywhere, different dropout masks per rank
    module = PretrainingLoss(bert)
    engine, _, _, _ = kaisa_ds.initialize(model=module, model_parameters=module.parameters(), config=cfg)
    micro, gas, global_batch = (engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(),
                                engine.train_batch_size())
    check_enough_examples(len(train_set), global_batch=global_batch, world=world, folder=folder)
    ckpt_dir = out / "checkpoints"
    start, consumed = checkpoints.load(engine, chosen, rank=rank) if chosen is not None else (0, 0)
    batches = iter(MicroBatches(train_set, micro_batch=micro, seed=args.seed, rank=rank, world=world,
                                consumed=consumed))
    metrics = MetricsLog(out / "metrics.jsonl", enabled=rank == 0, resume_step=start if args.resume else None)
    # without K-FAC the run still reports its gradient noise scale (a K-FAC run's is in its diagnostics)
    noise = None if engine.kfac is not None else EngineNoiseProbe(engine, samples_per_pass=micro, world=world,
                                                                   start_step=start)
    baseline = most_frequent_target(train_set)
    stop = min(max_steps, start + args.stop_after) if args.stop_after else max_steps
    bar = tqdm(total=max_steps, initial=start, desc=f"phase {args.phase}", unit="step", disable=rank != 0)
    t_start, last, reached = time.perf_counter(), {}, False
    elapsed = resumed_elapsed(out / "metrics.jsonl", start) if args.resume and rank == 0 else 0.0  # rank 0 logs
    for step in range(start + 1, stop + 1):
        faults.inject("step", rank=rank, step=step)
        t_step = time.perf_counter()
        row = train_step(engine, module, batches, step=step, world=world, gas=gas, global_batch=global_batch,
                         noise=noise)
        elapsed += time.perf_counter() - t_step
        row["elapsed_s"] = round(elapsed, 4)  # training time only: evaluation and saving are not counted
        consumed += gas
        if step % args.eval_every == 0 or step == max_steps:
            for name, data in (extra_eval or {"": heldout}).items():
                result = evaluate(module, data, device=engine.device, examples=args.eval_examples,
                                  micro_batch=micro, rank=rank, world=world, baseline_token=baseline)
                row.update(eval_sets.renamed(result, name) if name else result)
        reached = reached_target(row, args.stop_at_heldout)  # the loss is reduced over ranks: all agree
        metrics.write(row)  # rank 0's; DeepSpeed's monitor writes on rank 0 only too
        send_to_monitor(engine, row)
        last = row
        bar.update()
        bar.set_postfix(loss=f"{row['loss']:.3f}")
        if (args.save_every and step % args.save_every == 0) or step == max_steps or reached:
            checkpoints.save(engine, ckpt_dir, step=step, consumed=consumed, rank=rank, world=world,
                             keep=args.keep_checkpoints, pins=pins, vocab=cache / "vocab.txt")
        if reached:
            logger.info("held-out MLM loss %.4f at step %d is at or below --stop-at-heldout %g: phase ends here",
                        row["heldout_mlm_loss"], step, args.stop_at_heldout)
            break
    bar.close()
    if stop < max_steps and not reached:
        logger.warning("stopped after step %d of %d (--stop-after); continue with --resume", stop, max_steps)
        return {"stopped_at": stop, "rank": rank}
    if not last and rank == 0:  # killed after the final checkpoint, before the summary: take the logged row
        last = next((r for r in reversed(metrics.rows()) if "loss" in r), {})
    summary = {"phase": args.phase, "steps": last.get("step", max_steps) if reached else max_steps,
               "scheduled_steps": max_steps, "resumed_from": start,
               **({"stopped_at_heldout": args.stop_at_heldout} if reached else {}),
               "wall_seconds": round(time.perf_counter() - t_start, 2), "world_size": world,
               "global_batch": global_batch, "kfac": engine.kfac is not None, "final_train_loss": last.get("loss"),
               **{k: v for k, v in last.items() if k.startswith("heldout_")}, **data_record(folder, cache, args),
               "rank": rank}
    if rank == 0:  # summary.json last: its presence means the run finished and wrote everything
        save_final(module, tok, cache / "vocab.txt", out / "final")
        plot_losses(metrics.rows(), out / "loss.png", f"phase {args.phase}" + (" + K-FAC" if engine.kfac else ""))
        write_atomic(out / "summary.json",
                     json.dumps({k: v for k, v in summary.items() if k != "rank"}, indent=1).encode())
    return summary


def reached_target(row: dict[str, Any], target: float | None) -> bool:
    """Whether this step's evaluation (if it had one) reached ``--stop-at-heldout``."""
    loss = row.get("heldout_mlm_loss")
    return target is not None and loss is not None and loss <= target


def data_record(folder: Path, cache: Path, args: Namespace) -> dict[str, Any]:
    """What the run trained and was evaluated on, read from the prepared data: the vocabulary's size, the
    [UNK] share of the training text and of each --eval-data set, and the training text's tokens."""
    record: dict[str, Any] = {}
    coverage = read_coverage(folder)
    if coverage is not None:
        record.update(vocab_size=coverage["vocab_size"], data_tokens=coverage["tokens"],
                      unk_share=round(unk_share(coverage), 6))
    for name, _ in getattr(args, "eval_data", None) or []:
        extra = read_coverage(eval_sets.folder(cache, name) / folder.name)
        if extra is not None:
            record[f"eval_{name}_unk_share"] = round(unk_share(extra), 6)
    return record


def train_step(engine: Any, module: PretrainingLoss, batches: Any, *, step: int, world: int, gas: int,
               global_batch: int, noise: EngineNoiseProbe | None = None) -> dict[str, Any]:
    """One optimizer step of ``gas`` micro-batches; the statistics are reduced over ranks once, at the end.
    ``noise``: a run without K-FAC measures its gradient noise scale there (``row["noise_scale"]``)."""
    from deepspeed import comm as dist

    t0 = time.perf_counter()
    lr = float(engine.get_lr()[0])  # the rate this step's update uses (the scheduler moves on in engine.step)
    totals = torch.zeros(len(STATS), device=engine.device)
    if noise is not None:
        noise.begin_step()
    for _ in range(gas):
        loss = engine(to_device(next(batches), engine.device))
        engine.backward(loss)
        if noise is not None and engine.is_gradient_accumulation_boundary():
            noise.at_boundary()
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
    if noise is not None and step % noise.every == 0:
        row["noise_scale"] = noise.snapshot()
    if engine.kfac is not None:
        row["kfac_ms"] = {k: round(v * 1000, 3) for k, v in engine.kfac.timings.items()}
        row["kfac_skipped_windows"] = int(engine.kfac.skipped_windows)
        # ν, damping, lr, eigenvalue ranges: python -m kaisa_ds.report plots them
        row["kfac"] = engine.kfac.diagnostics_snapshot()
    return row


def save_final(module: PretrainingLoss, tok: Any, vocab: Path, folder: Path) -> None:
    """The HF model and tokenizer (with vocab.txt) for phase 2 and SQuAD fine-tuning, written beside ``folder``
    and swapped in whole, so a crash leaves the old final/ or the new one, never a mix."""
    tmp, old = folder.with_name(f".{folder.name}.tmp"), folder.with_name(f".{folder.name}.old")
    for stale in (tmp, old):
        shutil.rmtree(stale, ignore_errors=True)
    module.bert_model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    (tmp / "vocab.txt").write_bytes(vocab.read_bytes())
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
