"""README's "The library in five lines" stays true: its code runs as written (with a model, loader and optimizer
put in), and its list of options is exactly KFACConfig's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

from kaisa_ds import KFACConfig
from tests.support.models import TinyMLP

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## The library in five lines")
    return text[start:text.index("\n## ", start + 1)]


def test_the_five_lines_train() -> None:
    code = re.search(r"```python\n(.*?)```", _section(), flags=re.S)
    assert code is not None
    torch.manual_seed(0)
    model = TinyMLP()
    batches = [torch.randn(8, 6) for _ in range(4)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scope = {"model": model, "loader": batches, "optimizer": optimizer, "lr_now": 0.1}
    exec(code.group(1), scope)  # the README's own snippet
    assert scope["precond"].steps == len(batches)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_listed_options_are_the_config_fields() -> None:
    listed = re.search(r"Every option is a\s+keyword \((.*?)\);", _section(), flags=re.S)
    assert listed is not None
    names = set(re.findall(r"`(\w+)`", listed.group(1)))
    fields = {f.name for f in dataclasses.fields(KFACConfig) if f.init}
    assert names == fields, (sorted(fields - names), sorted(names - fields))
