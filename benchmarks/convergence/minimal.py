"""The comparison through a minimal loop: the model, LAMB and ``KFACPreconditioner``, nothing else (issue 23, 2d).

``python -m benchmarks.convergence minimal --regime small --seeds 1`` trains LAMB and K-FAC at the library's
defaults (``{"enabled": true}``, LAMB's tuned lr and warmup) in one process, without DeepSpeed, without the
next-sentence task, and with examples of its own: the training part tokenised once and cut into contiguous blocks
([CLS] block [SEP], one segment), each optimizer step drawing blocks from a seeded permutation and masking them
afresh with BERT's rule (:func:`bert_pretrain.data.examples.mask_tokens`). The pipeline instead masks every
document 5 times before training and pairs sentences for NSP.

What stays the product's: the model size, LAMB and its PolyWarmUp schedule built from the run's DeepSpeed config
(:func:`kaisa_ds.optim.select.lamb_from_ds_config`, :func:`kaisa_ds.engine.ds_config.poly_warmup_from_config`),
the kfac section parsed as the engine parses it, K-FAC's learning rate following LAMB's, the gradient averaged over
``gas × ranks`` micro-batches of the regime's size (what DeepSpeed averages over its ranks and accumulation), and
the held-out MLM loss on the report-part examples the pipeline's runs are evaluated on (prepared by the same code
with the same fixed seed). If the pipeline's gain also shows here, it needs none of DeepSpeed, NSP or the
pipeline's example construction; if not, one of them is what it depends on.

Records: ``<results>/<regime>/minimal/{lamb,defaults}_seed<s>.json`` (reused when every input is the same),
``<regime>/minimal.json`` (per-seed reach of LAMB's final and best, beside the pipeline's same-day records of
the same seeds) and ``<regime>/minimal.png``.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.convergence.ablation import seed_rows, summarise
from benchmarks.convergence.defaults import defaults_spec
from benchmarks.convergence.parts import Parts
from benchmarks.convergence.plots import plot_curves
from benchmarks.convergence.regimes import Regime
from benchmarks.convergence.runner import RunSpec, final_spec, recorded_inputs, run_inputs
from benchmarks.harness.output import write_json
from bert_pretrain import eval_sets
from bert_pretrain.data.examples import IGNORE, ExampleSettings, Specials, mask_tokens
from bert_pretrain.data.loader import MicroBatches, load_split, to_device
from bert_pretrain.data.prepare import prepare_phase
from bert_pretrain.data.tokenizer import load_tokenizer
from bert_pretrain.evaluation import evaluate
from bert_pretrain.model import MaskedLMLoss, build_model
from kaisa_ds.engine.ds_config import parse_kfac_section, poly_warmup_from_config
from kaisa_ds.optim.select import lamb_from_ds_config
from kaisa_ds.preconditioner import KFACPreconditioner

logger = logging.getLogger(__name__)
LOOP = "minimal: one process, no DeepSpeed, no NSP, contiguous blocks masked afresh each step"
# --examples pipeline: the same loop on the pipeline's own prepared examples (sentence pairs, dupe_factor fixed
# maskings), NSP still off: tells the example construction apart from NSP and DeepSpeed
EXAMPLES = {"blocks": LOOP, "pipeline": "minimal: one process, no DeepSpeed, no NSP, the pipeline's prepared "
                                        "examples (sentence pairs, fixed maskings)"}
STEMS = {"blocks": "minimal", "pipeline": "minimal_pipeline_examples"}  # record folder and summary/plot names


def token_blocks(text: Path, tok: Any, *, seq: int) -> torch.Tensor:
    """The text's word pieces, in order, cut into rows of ``seq - 2`` (room for [CLS] and [SEP]); the tail that
    does not fill a row is dropped."""
    lines = [line for line in text.read_text(encoding="utf-8").splitlines() if line.strip()]
    ids = [i for piece in tok(lines, add_special_tokens=False)["input_ids"] for i in piece]
    body = seq - 2
    rows = len(ids) // body
    if rows == 0:
        raise ValueError(f"{text}: {len(ids)} word pieces cannot fill one block of {body}")
    return torch.tensor(ids[:rows * body], dtype=torch.long).view(rows, body)


class BlockBatches:
    """Endless micro-batches of blocks: a seeded permutation per pass over the text, masks drawn when a block is
    used (a block seen twice is masked twice differently)."""

    def __init__(self, blocks: torch.Tensor, *, micro_batch: int, max_predictions: int, specials: Specials,
                 seed: int) -> None:
        self.blocks, self.micro_batch, self.specials = blocks, micro_batch, specials
        self.settings = ExampleSettings(max_seq_length=blocks.size(1) + 2, max_predictions=max_predictions)
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.used = 0

    @property
    def passes(self) -> float:
        """Passes over the text so far."""
        return self.used / self.blocks.size(0)

    def next(self) -> dict[str, torch.Tensor]:
        picked = []
        for _ in range(self.micro_batch):
            if not self.order:
                self.order = torch.randperm(self.blocks.size(0), generator=self.generator).tolist()
            picked.append(self.order.pop())
        self.used += len(picked)
        sp, n = self.specials, self.settings.max_predictions
        inputs, positions, ids = [], [], []
        for row in picked:
            masked, pos, orig = mask_tokens([sp.cls, *self.blocks[row].tolist(), sp.sep], self.settings, sp, self.rng)
            inputs.append(masked)
            positions.append(pos + [0] * (n - len(pos)))
            ids.append(orig + [IGNORE] * (n - len(orig)))
        input_ids = torch.tensor(inputs)
        return {"input_ids": input_ids, "token_type_ids": torch.zeros_like(input_ids),
                "attention_mask": torch.ones_like(input_ids), "masked_lm_positions": torch.tensor(positions),
                "masked_lm_ids": torch.tensor(ids)}


class PreparedBatches:
    """The pipeline's prepared training examples (``bert_pretrain``'s data for this seed: sentence pairs, each
    document masked ``dupe_factor`` times before training), drawn as one rank draws them."""

    def __init__(self, regime: Regime, parts: Parts, *, vocab: Path, cache: Path, seed: int) -> None:
        folder = prepare_phase([parts.path("train")], cache, phase=1, vocab=vocab, dupe_factor=regime.dupe_factor,
                               seed=seed, max_seq_length=regime.seq, max_predictions=regime.max_predictions)
        self.examples = load_split(folder, "train")
        self.documents_per_pass = len(self.examples) / regime.dupe_factor  # one masking of every document
        self.batches = iter(MicroBatches(self.examples, micro_batch=regime.micro_batch, seed=seed, rank=0, world=1))
        self.used = 0

    @property
    def passes(self) -> float:
        """Passes over the text so far (each of the ``dupe_factor`` maskings is one pass)."""
        return self.used / self.documents_per_pass

    def next(self) -> dict[str, torch.Tensor]:
        batch = to_device(next(self.batches), torch.device("cpu"))
        self.used += batch["input_ids"].size(0)
        return batch


def heldout_mlm(module: MaskedLMLoss, examples: Any, *, count: int, micro_batch: int) -> float:
    """Mean MLM loss over the first ``count`` prepared held-out examples: the pipeline's own evaluation, one process."""
    metrics = evaluate(module, examples, device=torch.device("cpu"), examples=count, micro_batch=micro_batch)
    return metrics["heldout_mlm_loss"]


def report_examples(regime: Regime, parts: Parts, *, vocab: Path, cache: Path) -> Any:
    """The report part prepared as bert_pretrain's ``--eval-data report=...`` prepares it (same vocabulary, fixed
    seed), so both loops are evaluated on the same examples."""
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "vocab.txt").is_file():
        shutil.copyfile(vocab, cache / "vocab.txt")
    folders = eval_sets.prepare([("report", parts.path("report"))], cache, phase=1, lower_case=True,
                                doc_split="blocks", max_seq_length=regime.seq, max_predictions=regime.max_predictions)
    return eval_sets.load(folders["report"])


def train(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path, cache: Path,
          examples: str = "blocks") -> dict[str, Any]:
    """One run of the minimal loop on its own blocks or the pipeline's ``examples``; its record has the pipeline
    records' curve fields."""
    cfg = spec.ds_config(regime)
    tok = load_tokenizer(vocab)
    batches: BlockBatches | PreparedBatches  # only the source asked for is tokenised or prepared
    if examples == "pipeline":
        batches = PreparedBatches(regime, parts, vocab=vocab, cache=cache / f"train_seed{spec.seed}", seed=spec.seed)
    else:
        batches = BlockBatches(token_blocks(parts.path("train"), tok, seq=regime.seq), micro_batch=regime.micro_batch,
                               max_predictions=regime.max_predictions, specials=Specials.of(tok), seed=spec.seed)
    heldout = report_examples(regime, parts, vocab=vocab, cache=cache)
    torch.manual_seed(spec.seed)
    module = MaskedLMLoss(build_model(regime.model_size, vocab_size=len(tok), mlm_only=True)).train()
    optimizer, impl = lamb_from_ds_config(cfg["optimizer"], module)
    scheduler = poly_warmup_from_config(cfg["lr_schedule"])(optimizer)
    passes = regime.gas * regime.ranks  # micro-batches averaged into one step, as DeepSpeed averages them
    section = parse_kfac_section(cfg)
    kfac = None
    if section.enabled:
        kfac = KFACPreconditioner(module, config=section.config, lr=lambda step: float(scheduler.get_last_lr()[0]),
                                  accumulation_steps=passes)
    steps: list[int] = []
    seconds: list[float] = []
    values: list[float] = []
    train_values: list[float] = []
    window = torch.zeros(())
    elapsed = 0.0
    for step in tqdm(range(1, spec.steps + 1), desc=f"minimal {spec.name}", unit="step"):
        start = time.perf_counter()
        for _ in range(passes):
            loss = module(batches.next())
            (loss / passes).backward()
            window += loss.detach() / passes
        if kfac is not None:
            kfac.step()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed += time.perf_counter() - start
        if step % regime.eval_every == 0 or step == spec.steps:
            value = heldout_mlm(module, heldout, count=regime.eval_examples, micro_batch=regime.micro_batch)
            mean_train = float(window) / (step - (steps[-1] if steps else 0))
            if not (math.isfinite(value) and math.isfinite(mean_train)):
                raise FloatingPointError(f"{spec.name}: non-finite loss at step {step} (held-out {value}, "
                                         f"training {mean_train})")
            steps.append(step)
            seconds.append(round(elapsed, 3))
            values.append(value)
            train_values.append(mean_train)
            window.zero_()
    return {"spec": spec.key(), "loop": EXAMPLES[examples], "lamb": impl,
            "kfac_layers": len(kfac.layers) if kfac else 0,
            "curve": {"steps": steps, "seconds": seconds, "values": values},
            "train_curve": {"steps": steps, "seconds": seconds, "values": train_values},
            "final": values[-1], "train_seconds": elapsed, "passes_over_text": round(batches.passes, 2),
            "examples": examples, "error": None}


def run_minimal(spec: RunSpec, regime: Regime, parts: Parts, *, vocab: Path, work: Path, record: Path,
                machine: dict[str, Any], examples: str = "blocks") -> dict[str, Any]:
    """Train (or reuse the record of) one minimal-loop run."""
    inputs = {**run_inputs(spec, regime, parts, vocab=vocab), "loop": EXAMPLES[examples]}
    if record.is_file():
        old = json.loads(record.read_text())
        if recorded_inputs(old) == inputs:
            logger.info("%s: recorded in %s; reused", spec.name, record)
            return dict(old)
    result = {"inputs": inputs, **train(spec, regime, parts, vocab=vocab, cache=work / "minimal_data" / regime.name,
                                        examples=examples), "machine": machine}
    write_json(result, record)
    return result


def minimal(*, regime: Regime, parts: Parts, chosen: dict[str, Any], seeds: list[int], vocab: Path, work: Path,
            out: Path, info: dict[str, Any], examples: str = "blocks") -> dict[str, Any]:
    """LAMB and K-FAC at the library's defaults through the minimal loop, per seed, beside the pipeline's same-day
    records of the same seeds (when there are); writes ``minimal.json`` and ``minimal.png`` (with the pipeline's
    ``examples``: ``minimal_pipeline_examples.*``)."""
    stem = STEMS[examples]
    records: dict[str, list[dict[str, Any]]] = {"lamb": [], "defaults": []}
    for seed in seeds:
        specs = {"lamb": final_spec(regime=regime, chosen=chosen, optimizer="lamb", seed=seed),
                 "defaults": defaults_spec(regime=regime, lamb=chosen["lamb"], seed=seed, steps=regime.steps)}
        for name, spec in specs.items():
            records[name].append(run_minimal(spec, regime, parts, vocab=vocab, work=work, machine=info,
                                             record=out / stem / f"{name}_seed{seed}.json", examples=examples))
    pipeline: dict[str, list[dict[str, Any]]] = {"lamb": [], "defaults": []}
    for name in pipeline:
        for seed in seeds:
            path = out / "same_day" / f"{name}_seed{seed}.json"
            if path.is_file():
                pipeline[name].append(json.loads(path.read_text()))
    rows = seed_rows(records["lamb"], {"defaults": records["defaults"]})
    pipeline_rows = seed_rows(pipeline["lamb"], {"defaults": pipeline["defaults"]})
    result = {"regime": regime.name, "seeds": seeds, "loop": EXAMPLES[examples], "lamb": chosen["lamb"],
              "kfac_section": {"enabled": True}, "rows": rows, "summary": summarise(rows),
              "passes_over_text": {n: [r["passes_over_text"] for r in rs] for n, rs in records.items()},
              "pipeline_same_day_rows": pipeline_rows, "machine": info}
    write_json(result, out / f"{stem}.json")
    plot_curves({"LAMB, minimal loop": records["lamb"], "K-FAC defaults, minimal loop": records["defaults"],
                 "LAMB, pipeline": pipeline["lamb"], "K-FAC defaults, pipeline": pipeline["defaults"]},
                title=f"{regime.name} regime, report part: the minimal loop ({examples} examples) beside the pipeline "
                      f"(seeds {seeds})", ylabel="held-out MLM loss (report part)", out=out / f"{stem}.png")
    return result
