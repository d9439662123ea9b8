"""The public API and its documentation cannot drift apart: every name in ``kaisa_ds.__all__`` has a section in
docs/API.md (and nothing else does), every argument of every public function and method is an ``Args:`` entry of its
docstring and is named in that section, every public method is named there, and every enum value is described in
both places."""

from __future__ import annotations

import enum
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import kaisa_ds

API_MD = Path(__file__).resolve().parents[2] / "docs" / "API.md"
NOT_ARGS = {"self", "cls"}


def _sections() -> dict[str, str]:
    """``name -> text`` of each ``## `name` `` section of docs/API.md."""
    parts = re.split(r"^## `([\w.]+)`[^\n]*$", API_MD.read_text(encoding="utf-8"), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _public_members(cls: type) -> dict[str, Any]:
    """Methods and properties a class defines itself (not inherited), without a leading underscore."""
    out = {}
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if inspect.isfunction(member) or isinstance(member, property):
            out[name] = member
    return out


def _documented_callables() -> list[tuple[str, str, Callable[..., Any]]]:
    """``(exported name, qualified name, callable)``: every exported function, class constructor and public method
    whose arguments must be documented (enums have none of their own)."""
    found = []
    for name in kaisa_ds.__all__:
        obj = getattr(kaisa_ds, name)
        if inspect.isclass(obj) and issubclass(obj, enum.Enum):
            continue
        found.append((name, name, obj))
        if inspect.isclass(obj):
            found += [(name, f"{name}.{m}", f) for m, f in _public_members(obj).items() if inspect.isfunction(f)]
    return found


def _arguments(obj: Callable[..., Any]) -> list[str]:
    return [p for p in inspect.signature(obj).parameters if p not in NOT_ARGS]


def _args_entries(doc: str) -> set[str]:
    """Names with an entry (``name: what it means``) in the docstring's ``Args:`` block."""
    block = re.search(r"^(\s*)Args:\s*\n(.*?)(?=^\1\S|\Z)", doc, flags=re.M | re.S)
    return set(re.findall(r"^\s+\*{0,2}(\w+):", block.group(2), flags=re.M)) if block else set()


def test_every_exported_name_has_a_section_and_every_section_an_export() -> None:
    sections = set(_sections())
    assert not set(kaisa_ds.__all__) - sections, f"exported but not in docs/API.md: {set(kaisa_ds.__all__) - sections}"
    assert not sections - set(kaisa_ds.__all__), f"in docs/API.md but not exported: {sections - set(kaisa_ds.__all__)}"


@pytest.mark.parametrize(("exported", "qualname", "obj"), _documented_callables(),
                         ids=[q for _, q, _ in _documented_callables()])
def test_every_argument_is_in_the_docstring_and_on_the_page(exported: str, qualname: str,
                                                            obj: Callable[..., Any]) -> None:
    doc = inspect.getdoc(obj)
    assert doc, f"{qualname} has no docstring"
    arguments = _arguments(obj)
    missing = [a for a in arguments if a not in _args_entries(doc)]
    assert not missing, f"{qualname}'s docstring has no Args: entry for {missing}"
    section = _sections()[exported]
    unnamed = [a for a in arguments if f"`{a}`" not in section]
    assert not unnamed, f"docs/API.md's {exported} section does not name {qualname}'s argument(s) {unnamed}"


@pytest.mark.parametrize("name", [n for n in kaisa_ds.__all__ if inspect.isclass(getattr(kaisa_ds, n))
                                  and not issubclass(getattr(kaisa_ds, n), enum.Enum)])
def test_every_public_method_has_a_docstring_and_is_on_the_page(name: str) -> None:
    members = _public_members(getattr(kaisa_ds, name))
    undocumented = sorted(m for m, f in members.items() if not inspect.getdoc(f))
    assert not undocumented, f"{name}: public methods without a docstring: {undocumented}"
    section = _sections()[name]
    absent = sorted(m for m in members if not re.search(rf"`{m}[`(]", section))
    assert not absent, f"docs/API.md's {name} section does not name {absent}"


@pytest.mark.parametrize("name", [n for n in kaisa_ds.__all__ if inspect.isclass(getattr(kaisa_ds, n))
                                  and issubclass(getattr(kaisa_ds, n), enum.Enum)])
def test_every_enum_value_is_described(name: str) -> None:
    cls = getattr(kaisa_ds, name)
    doc, section = inspect.getdoc(cls) or "", _sections()[name]
    values = [str(m.value) for m in cls]
    assert [v for v in values if f"``{v}``" not in doc] == [], f"{name}'s docstring does not describe every value"
    assert [v for v in values if f"- `{v}`" not in section] == [], f"docs/API.md's {name} lacks a value's entry"
