"""The layers and factors K-FAC would precondition, read from a model built on the ``meta`` device.

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
from kaisa_ds.layers.discovery import KFACLayer, discover_layers, share_inputs
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

    @property
    def grad_numel(self) -> int:
        return self.out * self.inp


@dataclass
class ModelShapes:
    """Everything the planner needs about a model: factors, layers and work units, in K-FAC's own order."""

    factors: dict[str, FactorShape]
    layers: dict[str, LayerShape]
    work: list[WorkUnit]

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
    shapes = {n: LayerShape(n, ly.a.name, ly.g.name, out=ly.g.dim, inp=ly.a.dim, unit=ly.unit)
              for n, ly in kept.items()}
    return ModelShapes(factors=factors, layers=shapes, work=work)


def trace_shapes(model: nn.Module, config: KFACConfig, forward: Forward) -> ModelShapes:
    """Discover ``model``'s K-FAC layers and run ``forward(model)`` once with the real hooks attached."""
    layers = discover_layers(model, config)
    capture = HookCapture(enabled=lambda: True, on_input=lambda name, x: None, on_output_grad=lambda name, g: None)
    for name, layer in layers.items():
        capture.attach(name, layer.module)
    model.train()
    try:
        with torch.enable_grad():
            forward(model)
    finally:
        capture.remove_all()
    return shapes_of(layers, fired=capture.fired, same_input=capture.same_input)


def bert_config(source: str | Path, *, vocab: int) -> Any:
    """A ``BertConfig`` from a size name (kaisa_ds.plan.bert_sizes) or an HF folder's ``config.json``."""
    from transformers import BertConfig

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
        if data.get("model_type", "bert") != "bert":
            raise ValueError(f"--model {file}: model_type {data.get('model_type')!r} is not a BertConfig; the "
                             "planner builds BERT models")
        return BertConfig.from_pretrained(str(path), local_files_only=True)
    if str(source) not in SIZES:
        raise ValueError(f"--model {source}: neither a folder with config.json nor one of {', '.join(SIZES)}")
    hidden, layers, heads, inter = SIZES[str(source)]
    return BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=inter)


def bert_on_meta(config: Any) -> nn.Module:
    """``BertForPreTraining`` (what bert_pretrain trains) with every tensor on the meta device: no memory."""
    from transformers import BertForPreTraining

    with torch.device("meta"):
        return BertForPreTraining(config)


def bert_forward(seq: int) -> Forward:
    """One forward pass on meta tokens (no attention mask: building it would read tensor values)."""
    def run(model: nn.Module) -> Any:
        ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
        return model(input_ids=ids, token_type_ids=ids)

    return run


def bert_shapes(source: str | Path, config: KFACConfig, *, seq: int, vocab: int = 30522) -> tuple[ModelShapes, Any]:
    """K-FAC shapes of a BERT size or HF folder, and its ``BertConfig``."""
    cfg = bert_config(source, vocab=vocab)
    return trace_shapes(bert_on_meta(cfg), config, bert_forward(min(seq, cfg.max_position_embeddings))), cfg
