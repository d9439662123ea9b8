"""The question-answering model and its tokenizer, from a local Hugging Face model directory.

A ``bert_pretrain`` phase-2 output (``BertForPreTraining`` saved with ``save_pretrained`` plus its tokenizer), a
fine-tuned directory written by this job, or any local HF model directory. The pretraining heads are dropped and
a fresh span head (``qa_outputs``) is initialised, as in BERT's fine-tuning. Nothing is fetched from the Hub.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


class ModelDirectoryError(ValueError):
    """A model directory that cannot be used; the message says which file is missing or wrong."""


def check_model_dir(path: str | Path) -> Path:
    """``path`` if it holds a config, weights and a tokenizer; otherwise raise naming what is missing."""
    path = Path(path)
    if not path.is_dir():
        raise ModelDirectoryError(f"model directory {path} does not exist (give a bert_pretrain phase-2 output "
                                  "or another directory written by save_pretrained)")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        missing.append("weights (one of " + ", ".join(WEIGHT_FILES) + ")")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json or vocab.txt; save it with tokenizer.save_pretrained(dir))")
    if missing:
        raise ModelDirectoryError(f"model directory {path} lacks " + "; ".join(missing))
    return path


def load_tokenizer(path: str | Path):  # type: ignore[no-untyped-def]
    """The fast tokenizer saved in a model directory (offsets are needed to map spans back to text)."""
    from transformers import AutoTokenizer

    path = check_model_dir(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if not getattr(tokenizer, "is_fast", False):
        raise ModelDirectoryError(f"{path}: the tokenizer ({type(tokenizer).__name__}) is not a fast tokenizer; "
                                  "save a tokenizer.json with the model (any *TokenizerFast.save_pretrained does)")
    for name in ("cls_token_id", "sep_token_id", "pad_token_id"):
        if getattr(tokenizer, name, None) is None:
            raise ModelDirectoryError(f"{path}: the tokenizer has no {name.removesuffix('_id')} token; a BERT "
                                      "vocabulary needs [CLS], [SEP] and [PAD]")
    return tokenizer


def load_qa_model(path: str | Path):  # type: ignore[no-untyped-def]
    """(model, tokenizer): a question-answering head on the directory's encoder, and the directory's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering
    from transformers.utils import logging as hf_logging

    path = check_model_dir(path)
    tokenizer = load_tokenizer(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    if len(tokenizer) > config.vocab_size:
        raise ModelDirectoryError(f"{path}: the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                                  f"{config.vocab_size}; the tokenizer does not belong to these weights")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the expected "qa_outputs newly initialised" report is logged below instead
    try:
        model, info = AutoModelForQuestionAnswering.from_pretrained(  # fp32 master weights; DeepSpeed casts
            str(path), local_files_only=True, output_loading_info=True, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ModelDirectoryError(f"{path}: cannot load a question-answering model: {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    fresh = sorted(info.get("missing_keys", []))
    non_head = [k for k in fresh if not k.startswith("qa_outputs")]
    if non_head:
        logger.warning("%s: %d encoder weight(s) were not in the checkpoint and are randomly initialised (e.g. %s)",
                       path, len(non_head), non_head[0])
    if fresh:
        logger.info("%s: initialised a new span head (%s)", path, ", ".join(k for k in fresh if k not in non_head))
    return model, tokenizer
