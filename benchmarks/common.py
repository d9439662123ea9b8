"""Shared benchmark helpers: machine description, tables, JSON output, timing and BERT models."""

from __future__ import annotations

import contextlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results"
BERT_SIZES = {"tiny": (128, 2, 2, 512), "mini": (256, 4, 4, 1024), "base": (768, 12, 12, 3072),
              "large": (1024, 24, 16, 4096)}  # hidden, layers, heads, intermediate
KAISA_SKIP = ["embeddings", "cls", "pooler"]


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                            "torch": torch.__version__, "date": date.today().isoformat()}
    with contextlib.suppress(OSError, StopIteration):
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                                 .splitlines() if line.startswith("model name"))
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def write_json(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain-text table (also valid Markdown)."""
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def median_seconds(fn: Callable[[], Any], repeats: int, *, cuda: bool = False) -> float:
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bert_for_pretraining(size: str, *, vocab: int = 30522, seq: int = 128) -> torch.nn.Module:
    from transformers import BertConfig, BertForPreTraining

    hidden, layers, heads, inter = BERT_SIZES[size]
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                         num_attention_heads=heads, intermediate_size=inter,
                                         max_position_embeddings=max(512, seq)))


def pretraining_loss(model: Any, ids: torch.Tensor, labels: torch.Tensor, nsp: torch.Tensor) -> torch.Tensor:
    """MLM (decoder only at the masked positions) + NSP loss."""
    out = model.bert(input_ids=ids)
    where = labels != -100
    mlm = torch.nn.functional.cross_entropy(model.cls.predictions(out.last_hidden_state[where]), labels[where])
    return mlm + torch.nn.functional.cross_entropy(model.cls.seq_relationship(out.pooler_output), nsp)


def random_batch(batch: int, seq: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(min(1000, vocab // 2), vocab, (batch, seq), generator=g)
    labels = torch.where(torch.rand(batch, seq, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    nsp = torch.randint(0, 2, (batch,), generator=g)
    return ids.to(device), labels.to(device), nsp.to(device)


def spawn(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned gloo ranks; return each rank's (picklable) result."""
    import os
    import tempfile

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        procs = [ctx.Process(target=_spawned, args=(r, world, init, fn, args, queue)) for r in range(world)]
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=1800) for _ in range(world))
        for p in procs:
            p.join()
    failed = [r for r, v in results.items() if isinstance(v, str) and v.startswith("FAILED")]
    if failed:
        raise RuntimeError(results[failed[0]])
    return [results[r] for r in range(world)]


def _spawned(rank: int, world: int, init: str, fn: Callable[..., Any], args: tuple[Any, ...], queue: Any) -> None:
    import traceback

    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
        queue.put((rank, fn(rank, world, *args)))
    except Exception:
        queue.put((rank, f"FAILED on rank {rank}:\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
