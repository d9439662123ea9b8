"""The layout ARCHITECTURE.md describes is the layout the code has: imports point down its floors, each row's
"imports from" column names exactly the places its modules import, no import cycle (type-only imports included), at
most 10 modules at kaisa_ds's root, no kaisa_ds module over 300 lines, and every home of the one-home table
exists."""

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


def _place(text: str) -> str:
    """``b/c.py`` -> ``kaisa_ds.b.c`` (a place as the table writes it, as a module name)."""
    return "kaisa_ds." + text.removesuffix(".py").strip("/").replace("/", ".")


def _table_rows() -> list[tuple[float, list[str], str]]:
    """ARCHITECTURE.md's floor table: ``(floor, places, "imports from" cell)`` per row."""
    rows = []
    for line in (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines():
        row = re.match(r"\|\s*(\d+(?:\.\d+)?)\s*\|([^|]+)\|[^|]*\|([^|]*)\|\s*$", line)
        if row:
            rows.append((float(row[1]), [_place(p) for p in re.findall(r"`([\w/.]+)`", row[2])], row[3].strip()))
    return rows


def _floors() -> dict[str, float]:
    """``place -> floor`` from ARCHITECTURE.md's table rows ``| floor | `a.py`, `b/` | ...``."""
    return {place: floor for floor, places, _ in _table_rows() for place in places}


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


def test_the_imports_from_column_names_exactly_what_each_row_imports() -> None:
    """The column once said `report/` imports floors 0-1 (it imports checkpoint/atomic), that `distributed/`
    imports decomposition (it does not) and left four of `plan/`'s out. A place named as a file inside a folder
    (`optim/select.py`) claims that only that file of the folder is imported."""
    floors = _floors()
    rows = _table_rows()
    assert len(rows) >= 10, "ARCHITECTURE.md's floor table was not found"
    wrong = []
    for _floor, places, cell in rows:
        listed = [_place(p) for p in re.findall(r"`([\w/.]+)`", re.sub(r"\([^)]*\)", "", cell))]
        if not listed:
            assert cell == "nothing of kaisa_ds", f"{places}: 'imports from' is neither places nor 'nothing': {cell!r}"
        imported: dict[str, set[str]] = {}  # place imported -> the modules of it imported
        for name, targets in GRAPH.items():
            here = _floor_of(name, floors)
            if here is None or here[0] not in places:
                continue
            for target in targets:
                there = _floor_of(target, floors)
                if there is not None and there[0] not in places:
                    imported.setdefault(there[0], set()).add(target)
        named = {_floor_of(p, floors)[0] if _floor_of(p, floors) else p: p for p in listed}
        missing = sorted(set(imported) - set(named))
        stale = sorted(set(named) - set(imported))
        if missing or stale:
            wrong.append(f"{places}: imports {missing} the column does not name; the column names {stale}, "
                         "which it does not import")
        for place, spelled in named.items():
            if spelled != place and place in imported:  # a file of a folder: nothing else of it
                others = sorted(m for m in imported[place] if m != spelled and not m.startswith(spelled + "."))
                if others:
                    wrong.append(f"{places}: the column names {spelled} of {place}, but {others} are imported too")
    assert not wrong, "\n".join(wrong)


def test_every_home_of_the_one_home_table_exists() -> None:
    """Homes once named a file that did not hold the concept (dtype names under config.py)."""
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = text[text.index("## One home per concept"):]
    homes = [re.findall(r"`([\w/.]+\.py|[\w/]+/)`", line.split("|")[2]) for line in table.splitlines()
             if line.startswith("| ") and not line.startswith("| concept")]
    assert len(homes) >= 10 and all(homes), homes
    absent = [h for row in homes for h in row if not (REPO / h).exists()]
    assert not absent, absent
    dtype_home = next(row for line, row in zip(
        [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| concept")], homes)
        if line.startswith("| dtype names"))
    assert [h for h in dtype_home if re.search(r"^DTYPES\b", (REPO / h).read_text(encoding="utf-8"), flags=re.M)]


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
