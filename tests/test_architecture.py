"""The layout ARCHITECTURE.md describes is the layout the code has: imports point down its floors, no import cycle
(type-only imports included), at most 10 modules at kaisa_ds's root, no kaisa_ds module over 300 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "kaisa_ds"


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """kaisa_ds modules ``name`` imports, at any place in the file (TYPE_CHECKING blocks and functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            candidates = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in MODULES and c != name and not name.startswith(c + ".")}
    return found


GRAPH = {name: _imports(name) for name in MODULES}

def _floors() -> dict[str, float]:
    """``place -> floor`` from ARCHITECTURE.md's table rows ``| floor | `a.py`, `b/` | ...``."""
    floors: dict[str, float] = {}
    for line in (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines():
        row = re.match(r"\|\s*(\d+(?:\.\d+)?)\s*\|([^|]+)\|", line)
        if row:
            for place in re.findall(r"`([\w/.]+)`", row[2]):
                floors["kaisa_ds." + place.removesuffix(".py").strip("/").replace("/", ".")] = float(row[1])
    return floors


def _floor_of(name: str, floors: dict[str, float]) -> tuple[str, float] | None:
    places = [p for p in floors if name == p or name.startswith(p + ".")]
    return (max(places, key=len), floors[max(places, key=len)]) if places else None


def test_every_kaisa_ds_module_has_a_floor_in_architecture_md() -> None:
    floors = _floors()
    assert len(floors) >= 10, "ARCHITECTURE.md's floor table was not found"
    missing = [m for m in MODULES if m != "kaisa_ds" and _floor_of(m, floors) is None]
    assert not missing, f"modules ARCHITECTURE.md does not place: {missing}"


def test_imports_point_down_the_floors() -> None:
    floors = _floors()
    upward = []
    for name, targets in GRAPH.items():
        here = _floor_of(name, floors)
        for target in targets:
            there = _floor_of(target, floors)
            if here is None or there is None or here[0] == there[0]:
                continue  # the package's public __init__, or a module importing within its own place
            if there[1] >= here[1]:
                upward.append(f"{name} (floor {here[1]:g}) imports {target} (floor {there[1]:g})")
    assert not upward, "\n".join(upward)


def test_no_import_cycle() -> None:
    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in GRAPH[node]:
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    cycles = sorted(f"{a} -> {b} -> ... -> {a}" for a, targets in GRAPH.items() for b in targets if reaches(b, a))
    assert not cycles, "\n".join(cycles)


def test_the_root_stays_small_and_modules_short() -> None:
    root = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(root) <= 10, root
    lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()}
    long = {name: n for name, n in lines.items() if n > 300}
    assert not long, long
