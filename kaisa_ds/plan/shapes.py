"""The layers and factors K-FAC would precondition, read from a model built on the ``meta`` device: a BERT size, or
any transformers model from its ``config.json``.

No weight is allocated: the model is built under ``torch.device("meta")`` and run forward once on meta
tokens with kaisa_ds's own hooks (:class:`~kaisa_ds.layers.hooks.HookCapture`), so layer discovery,
``skip_layers``, tied weights, layers whose hooks never fire, and query/key/value sharing one A factor are
decided by exactly the code a real run uses (:func:`~kaisa_ds.layers.discovery.discover_layers`,
:func:`~kaisa_ds.layers.discovery.share_inputs`, :func:`~kaisa_ds.structure.work_units`). BERT-Large takes seconds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kaisa_ds.config import KFACConfig
from kaisa_ds.distributed.assignment import WorkUnit
from kaisa_ds.layers.coverage import Coverage
from kaisa_ds.layers.discovery import KFACLayer, discover, share_inputs
from kaisa_ds.layers.hooks import HookCapture
from kaisa_ds.plan.bert_sizes import SIZES
from kaisa_ds.structure import factors_of, work_units

Forward = Callable[[nn.Module], Any]


@dataclass(frozen=True)
class FactorShape:
    name: str
    dim: int
    diagonal: bool

    @property
    def numel(self) -> int:
        """Elements of the stored factor (a diagonal factor is a vector)."""
        return self.dim if self.diagonal else self.dim * self.dim


@dataclass(frozen=True)
class LayerShape:
    """A preconditioned layer: its factors and its ``(out, in)`` gradient matrix (bias as an extra column)."""

    name: str
    a: str
    g: str
    out: int
    inp: int
    unit: str
    embedding: bool = False  # a table looked up by token ids (no GEMM in the forward pass)

    @property
    def grad_numel(self) -> int:
        return self.out * self.inp


@dataclass
class ModelShapes:
    """Everything the planner needs about a model: factors, layers and work units, in K-FAC's own order."""

    factors: dict[str, FactorShape]
    layers: dict[str, LayerShape]
    work: list[WorkUnit]
    coverage: Coverage | None = None  # what share of the model these layers are (None: not traced from a model)

    def unit_layers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for layer in self.layers.values():
            out.setdefault(layer.unit, []).append(layer.name)
        return out


def shapes_of(layers: dict[str, KFACLayer], *, fired: set[str], same_input: dict[str, str]) -> ModelShapes:
    """The shapes of the layers that fired, with shared A factors, as :func:`build_structure` keeps them."""
    kept = {n: dataclasses.replace(ly) for n, ly in layers.items() if n in fired}
    share_inputs(kept, same_input)
    _, work = work_units(kept)
    factors = {n: FactorShape(n, f.dim, f.diagonal) for n, f in factors_of(kept).items()}
    shapes = {n: LayerShape(n, ly.a.name, ly.g.name, out=ly.g.dim, inp=ly.a.dim, unit=ly.unit,
                            embedding=ly.helper.one_hot_input) for n, ly in kept.items()}
    return ModelShapes(factors=factors, layers=shapes, work=work)


def trace_shapes(model: nn.Module, config: KFACConfig, forward: Forward) -> ModelShapes:
    """Discover ``model``'s K-FAC layers and run ``forward(model)`` once with the real hooks attached."""
    layers, coverage = discover(model, config)
    capture = HookCapture(enabled=lambda: True, on_input=lambda name, x, pass_id: None,
                          on_output_grad=lambda name, g, pass_id: None)
    for name, layer in layers.items():
        capture.attach(name, layer.module)
    model.train()
    try:
        with torch.enable_grad():
            forward(model)
    finally:
        capture.remove_all()
    shapes = shapes_of(layers, fired=capture.fired, same_input=capture.same_input)
    shapes.coverage = coverage.not_called(set(layers) - capture.fired).called(capture.multi_call)
    return shapes


def model_config(source: str | Path, *, vocab: int) -> Any:
    """The model's HF config: a BERT size (kaisa_ds.plan.bert_sizes) or an HF folder's ``config.json`` of any
    model type (Llama, GPT-2, T5, ...)."""
    from transformers import AutoConfig, BertConfig

    path = Path(source)
    if path.is_dir():
        file = path / "config.json"
        if not file.is_file():
            raise ValueError(f"--model {path}: the folder has no config.json; give an HF model folder (written by "
                             f"save_pretrained) or a size: {', '.join(SIZES)}")
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"--model {file} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or "model_type" not in data:
            raise ValueError(f"--model {file} has no model_type: it is not a transformers config.json")
        try:
            return AutoConfig.from_pretrained(str(path), local_files_only=True)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"--model {file}: transformers cannot read it ({exc})") from exc
    if str(source) not in SIZES:
        raise ValueError(f"--model {source}: neither a folder with config.json nor one of {', '.join(SIZES)}")
    hidden, layers, heads, inter = SIZES[str(source)]
    return BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=inter)


def is_bert(cfg: Any) -> bool:
    return getattr(cfg, "model_type", "") == "bert"


def max_positions(cfg: Any) -> int | None:
    """The longest sequence the model takes (None: no learned positions, e.g. T5's relative ones)."""
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    return None


def model_on_meta(cfg: Any) -> nn.Module:
    """The model with every tensor on the meta device (no memory): ``BertForPreTraining`` for BERT (what
    bert_pretrain trains), else the config's causal-LM, seq2seq, masked-LM or bare model, the first that exists."""
    import transformers

    with torch.device("meta"):
        if is_bert(cfg):
            return transformers.BertForPreTraining(cfg)
        for auto in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM", "AutoModel"):
            try:
                return getattr(transformers, auto).from_config(cfg)  # type: ignore[no-any-return]
            except ValueError:  # this config has no model of that kind
                continue
    raise ValueError(f"--model: transformers has no model for model_type {cfg.model_type!r}")


def meta_forward(cfg: Any, seq: int) -> Forward:
    """One forward pass on meta tokens (no attention mask: building it would read tensor values)."""
    def run(model: nn.Module) -> Any:
        ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
        if is_bert(cfg):
            return model(input_ids=ids, token_type_ids=ids)
        if getattr(cfg, "is_encoder_decoder", False):
            return model(input_ids=ids, decoder_input_ids=ids)
        return model(input_ids=ids)

    return run


def model_shapes(source: str | Path, config: KFACConfig, *, seq: int,
                 vocab: int = 30522) -> tuple[ModelShapes, Any]:
    """K-FAC shapes of a BERT size or an HF folder (any model type), and its config."""
    cfg = model_config(source, vocab=vocab)
    limit = max_positions(cfg)
    model = model_on_meta(cfg)
    return trace_shapes(model, config, meta_forward(cfg, min(seq, limit) if limit else seq)), cfg
