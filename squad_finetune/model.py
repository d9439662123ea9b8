"""The question-answering model and its tokenizer, from a local Hugging Face model directory.

A ``bert_pretrain`` run's model (``<output>/final``: ``BertForPreTraining`` saved with ``save_pretrained`` plus its
tokenizer and vocab.txt), a fine-tuned directory written by this job (``<output>/model``), or any local HF model
directory. The pretraining heads are dropped and a fresh span head (``qa_outputs``) is initialised, as in BERT's
fine-tuning. Nothing is fetched from the Hub.

A saved ``tokenizer.json`` is loaded as it is; a directory with only a vocab.txt gets its tokenizer from
``bert_pretrain.data.tokenizer.load_tokenizer``, the one place tokenizers are built from a vocabulary. Either way
the size and casing checks of that module apply (its [UNK]-coverage check needs the data: ``squad_finetune.coverage``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from bert_pretrain.data.tokenizer import check_vocab_size, is_cased
from bert_pretrain.data.tokenizer import load_tokenizer as tokenizer_from_vocab

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
        raise ModelDirectoryError(f"model directory {path} does not exist (give a bert_pretrain run's "
                                  "<output>/final or another directory written by save_pretrained)")
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


def load_tokenizer(path: str | Path) -> Any:
    """The fast tokenizer of a model directory (offsets are needed to map spans back to text), checked: at least
    ``bert_pretrain``'s minimum size, [CLS]/[SEP]/[PAD], and no capitals kept with an uncased vocabulary."""
    path = check_model_dir(path)
    if (path / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    else:  # only a vocab.txt: built where every tokenizer is built from a vocabulary
        tokenizer = tokenizer_from_vocab(path / "vocab.txt", lower_case=_config_lower_case(path),
                                         flag="--model")
    if not getattr(tokenizer, "is_fast", False):
        raise ModelDirectoryError(f"{path}: the tokenizer ({type(tokenizer).__name__}) is not a fast tokenizer; "
                                  "save a tokenizer.json with the model (any *TokenizerFast.save_pretrained does)")
    for name in ("cls_token_id", "sep_token_id", "pad_token_id"):
        if getattr(tokenizer, name, None) is None:
            raise ModelDirectoryError(f"{path}: the tokenizer has no {name.removesuffix('_id')} token; a BERT "
                                      "vocabulary needs [CLS], [SEP] and [PAD]")
    check_vocab_size(tokenizer, source=f"the tokenizer of --model {path}")
    _check_casing(tokenizer, path)
    return tokenizer


def _config_lower_case(path: Path) -> bool:
    """``do_lower_case`` from the directory's tokenizer_config.json (BERT's default, True, when it says nothing)."""
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return True
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("do_lower_case", True))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelDirectoryError(f"{config}: not a readable JSON file ({exc}); re-save the tokenizer") from None


def _lowercases(tokenizer: Any) -> bool:
    normalizer = tokenizer.backend_tokenizer.normalizer
    return normalizer is not None and normalizer.normalize_str("A") == "a"


def _check_casing(tokenizer: Any, path: Path) -> None:
    """Refuse a tokenizer that keeps capitals over an uncased vocabulary: every capitalised word would become
    [UNK] (about 14% of words in running text, under the [UNK] limit). The vocabulary decides, as in bert_pretrain."""
    if not _lowercases(tokenizer) and not is_cased(tokenizer.get_vocab()):
        raise ModelDirectoryError(f"--model {path}: its tokenizer keeps capitals but its vocabulary is uncased (no "
                                  "capitalised tokens), so every capitalised word would become [UNK]; re-save the "
                                  "tokenizer with do_lower_case=True (bert_pretrain without --cased does)")


def model_width(path: str | Path) -> int:
    """The model's hidden size, from its config.json (it decides the default recipe)."""
    from transformers import AutoConfig

    path = check_model_dir(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return int(AutoConfig.from_pretrained(str(path), local_files_only=True).hidden_size)
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelDirectoryError(f"{path}/config.json: cannot read the model's hidden_size ({exc})") from None


def load_qa_model(path: str | Path, tokenizer: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer): a question-answering head on the directory's encoder, and the directory's tokenizer
    (``tokenizer``: the one :func:`load_tokenizer` already gave for this directory)."""
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering
    from transformers.utils import logging as hf_logging

    path = check_model_dir(path)
    tokenizer = load_tokenizer(path) if tokenizer is None else tokenizer
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
