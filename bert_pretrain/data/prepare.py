"""Prepare a phase's examples once, as HF datasets Arrow shards with a manifest of the settings.

Re-running with the same inputs and settings reuses the shards. The work is spread over all cores with
``datasets.map(num_proc=...)``, with datasets' progress bars.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bert_pretrain.data.documents import DataError, read_documents
from bert_pretrain.data.examples import ExampleSettings, Specials, batch_examples
from bert_pretrain.data.tokenizer import load_tokenizer, train_vocab

logger = logging.getLogger(__name__)
PHASES = {1: (128, 20), 2: (512, 80)}  # max_seq_length, max_predictions_per_seq


def _fingerprint(paths: list[Path]) -> list[list[Any]]:
    return [[str(p.resolve()), p.stat().st_size, int(p.stat().st_mtime)] for p in paths]


def prepare_phase(texts: list[Path], out_dir: Path, *, phase: int, vocab: Path | None = None,
                  lower_case: bool = True, dupe_factor: int = 5, seed: int = 12345, heldout_fraction: float = 0.05,
                  max_seq_length: int | None = None, num_proc: int | None = None) -> Path:
    """Write ``out_dir/phase<N>/{train,heldout}`` and ``out_dir/vocab.txt``; return the phase folder."""
    from datasets import Dataset, load_from_disk

    seq, max_pred = PHASES[phase]
    seq = max_seq_length or seq
    settings = ExampleSettings(max_seq_length=seq, max_predictions=max_pred, dupe_factor=dupe_factor, seed=seed)
    folder = out_dir / f"phase{phase}"
    manifest = {"inputs": _fingerprint(texts), "vocab": str(vocab) if vocab else "trained", "lower_case": lower_case,
                "settings": asdict(settings), "heldout_fraction": heldout_fraction}
    if (folder / "manifest.json").is_file() and json.loads((folder / "manifest.json").read_text()) == manifest:
        logger.info("reusing prepared data in %s", folder)
        return folder
    docs_text = read_documents(texts)
    vocab_path = out_dir / "vocab.txt"
    if vocab is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        tok = load_tokenizer(vocab, lower_case=lower_case)
        vocab_path.write_text(vocab.read_text(encoding="utf-8"), encoding="utf-8")
    else:
        if not vocab_path.is_file():
            train_vocab(docs_text, out_dir, lower_case=lower_case)
        tok = load_tokenizer(vocab_path, lower_case=lower_case)
    sentences = [s for d in docs_text for s in d]
    ids = tok(sentences, add_special_tokens=False)["input_ids"]
    docs, pos = [], 0
    for d in docs_text:
        docs.append([x for x in ids[pos:pos + len(d)] if x])
        pos += len(d)
    docs = [d for d in docs if d]
    if len(docs) < 2:
        raise DataError(f"--data: the corpus has {len(docs)} usable document(s); next-sentence prediction needs at "
                        "least 2 (separate documents by blank lines)")
    specials = Specials(pad=tok.pad_token_id, cls=tok.cls_token_id, sep=tok.sep_token_id, mask=tok.mask_token_id,
                        vocab_size=len(tok))
    rows = Dataset.from_dict({"copy": [c for c in range(dupe_factor) for _ in docs],
                              "doc": [i for _ in range(dupe_factor) for i in range(len(docs))]})
    procs = max(1, min(num_proc or os.cpu_count() or 1, len(docs) // 50 or 1))
    examples = rows.map(batch_examples, batched=True, batch_size=64, remove_columns=["copy", "doc"],
                        num_proc=procs if procs > 1 else None, desc=f"phase {phase} examples",
                        fn_kwargs={"docs": docs, "settings": settings, "specials": specials})
    if len(examples) < 2:
        raise DataError(f"--data: only {len(examples)} example(s) could be made; the corpus is too small")
    split = examples.train_test_split(test_size=max(1, int(len(examples) * heldout_fraction)), seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    split["train"].save_to_disk(str(folder / "train"))
    split["test"].save_to_disk(str(folder / "heldout"))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    logger.info("phase %d: %d training and %d held-out examples of %d tokens in %s", phase, len(split["train"]),
                len(split["test"]), seq, folder)
    load_from_disk(str(folder / "train"))  # fail here, not in training, if the shards are unreadable
    return folder
