"""BERT's weight-decay groups (kaisa_ds.optim.param_groups), shared by LAMB and SQuAD's AdamW."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForQuestionAnswering, BertModel

from kaisa_ds.optim.param_groups import weight_decay_groups


def _tiny_bert() -> BertModel:
    return BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=16))


def test_param_groups_exclude_bias_and_layernorm_on_bert() -> None:
    model = _tiny_bert()
    decay, no_decay = weight_decay_groups(model, weight_decay=0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    layer_norm_ids = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    decay_names = sorted(names[id(p)] for p in decay["params"])
    no_decay_names = sorted(names[id(p)] for p in no_decay["params"])
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert "embeddings.word_embeddings.weight" in decay_names
    assert "encoder.layer.0.attention.self.query.weight" in decay_names
    assert "encoder.layer.1.output.LayerNorm.weight" in no_decay_names
    assert "embeddings.LayerNorm.bias" in no_decay_names and "pooler.dense.bias" in no_decay_names
    assert all(n.endswith("weight") and "LayerNorm" not in n for n in decay_names)
    assert all(n.endswith("bias") or id(dict(model.named_parameters())[n]) in layer_norm_ids for n in no_decay_names)
    assert len(decay_names) + len(no_decay_names) == len(list(model.parameters()))


def test_param_groups_find_layernorm_by_type_and_drop_empty_groups() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4, bias=False), torch.nn.LayerNorm(4))  # names "0.weight", ...
    decay, no_decay = weight_decay_groups(model, weight_decay=0.1)
    assert decay["params"] == [model[0].weight] and no_decay["params"] == [model[1].weight, model[1].bias]
    assert len(weight_decay_groups(torch.nn.Linear(2, 2, bias=False), weight_decay=0.1)) == 1


def test_the_squad_model_decays_exactly_its_matrices_and_embeddings() -> None:
    """The rule SQuAD's AdamW used (names ending in bias or LayerNorm.weight/.bias) gives these same groups."""
    model = BertForQuestionAnswering(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=32))
    decay, no_decay = weight_decay_groups(model, weight_decay=0.01)
    ends = ("bias", "LayerNorm.weight", "LayerNorm.bias")
    assert [n for n, _ in model.named_parameters() if not n.endswith(ends)] == \
        [n for n, p in model.named_parameters() if any(p is q for q in decay["params"])]
    assert all(p.dim() == 1 for p in no_decay["params"]) and "qa_outputs.bias" in {
        n for n, p in model.named_parameters() if any(p is q for q in no_decay["params"])}
