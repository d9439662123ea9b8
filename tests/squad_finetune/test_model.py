"""Model directories: a pretraining checkpoint becomes a QA model; incomplete directories get clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForPreTraining

from bert_pretrain.data.errors import DataError
from squad_finetune.model import ModelDirectoryError, load_qa_model
from tests.support.squad_data import numbered_words, save_tiny_qa_model, word_tokenizer


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return word_tokenizer(numbered_words(100))  # bert_pretrain's minimum vocabulary size, 100, and the specials


def _pretraining_dir(path: Path, tokenizer, vocab_size: int | None = None) -> Path:  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    config = BertConfig(vocab_size=vocab_size or len(tokenizer), hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    BertForPreTraining(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_pretraining_checkpoint_gives_qa_model_with_its_encoder(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = _pretraining_dir(tmp_path / "phase2", tokenizer)
    model, tok = load_qa_model(path)
    assert type(model).__name__ == "BertForQuestionAnswering"
    assert len(tok) == len(tokenizer) and tok.is_fast
    pre = BertForPreTraining.from_pretrained(path)
    for name, tensor in pre.bert.state_dict().items():
        if name in model.bert.state_dict():
            assert torch.equal(model.bert.state_dict()[name], tensor), name
    assert model.qa_outputs.weight.shape == (2, 32)


def test_finetuned_directory_round_trips(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = save_tiny_qa_model(tmp_path / "qa", tokenizer, hidden=32, layers=1)
    model, _ = load_qa_model(path)
    again, _ = load_qa_model(path)
    assert torch.equal(model.qa_outputs.weight, again.qa_outputs.weight)  # the head is loaded, not re-initialised


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelDirectoryError, match="does not exist"):
        load_qa_model(tmp_path / "absent")


def test_directory_without_weights(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = _pretraining_dir(tmp_path / "m", tokenizer)
    os.remove(path / "model.safetensors")
    with pytest.raises(ModelDirectoryError, match=r"lacks weights \(one of model.safetensors"):
        load_qa_model(path)


def test_directory_without_tokenizer(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = _pretraining_dir(tmp_path / "m", tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(path / name)
    with pytest.raises(ModelDirectoryError, match="lacks a tokenizer"):
        load_qa_model(path)


def test_tokenizer_larger_than_embedding(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = _pretraining_dir(tmp_path / "m", tokenizer, vocab_size=len(tokenizer) - 5)
    with pytest.raises(ModelDirectoryError, match="does not belong to these weights"):
        load_qa_model(path)


def test_vocab_txt_only_directory_gets_the_tokenizer_from_bert_pretrains_home(tmp_path: Path, tokenizer) -> None:  # type: ignore[no-untyped-def]
    path = _pretraining_dir(tmp_path / "m", tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(path / name)
    ids = tokenizer.get_vocab()
    (path / "vocab.txt").write_text("\n".join(sorted(ids, key=ids.__getitem__)) + "\n", encoding="utf-8")
    _, tok = load_qa_model(path)
    assert tok.get_vocab() == tokenizer.get_vocab() and tok.is_fast
    lower = tokenizer("w7 w8", add_special_tokens=False)["input_ids"]
    assert tok("W7 w8", add_special_tokens=False)["input_ids"] == lower  # do_lower_case: BERT's default


def test_tokenizer_smaller_than_bert_pretrains_minimum_is_refused(tmp_path: Path) -> None:
    path = _pretraining_dir(tmp_path / "m", word_tokenizer(numbered_words(20)))
    with pytest.raises(DataError, match="has 25 tokens; at least 100"):
        load_qa_model(path)
