"""The user documentation stays short, linked and true to the records and the code.

- README.md ≤ 12 KB and benchmarks/README.md ≤ 15 KB (the README once grew to 64 KB, the benchmarks page to 284 KB);
- every relative link of README.md, docs/ and benchmarks/README.md resolves, anchors included;
- every figure in a ``| figure | value | record | machine, date |`` table equals the record field it names, at the
  decimals it prints, and names the machine and date the record says it was made on;
- docs/configuration.md lists every ``KFACConfig`` field as the code has it (scripts/config_reference.py);
- every ``"kfac"`` JSON example in the docs is a section the engine accepts;
- docs/README.md indexes every page of docs/, and benchmarks/README.md every benchmark command;
- every file under benchmarks/results is claimed by a row of benchmarks/results/README.md, which says which command
  wrote it, and every row's pattern still matches a file.
"""

from __future__ import annotations

import importlib.util
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RESULTS = REPO / "benchmarks" / "results"
PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md", *DOCS.rglob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FIGURES_HEADER = "| figure | value | record | machine, date |"
VALUE = re.compile(r"^\**(?P<num>-?\d+(?:\.\d+)?)(?: ± (?P<std>\d+(?:\.\d+)?))?\**\s*(?P<unit>%|×|[A-Za-z]+)?\**$")
FIELD = re.compile(r"`([^`]+)`")


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize(("page", "limit"), [("README.md", 12_000), ("benchmarks/README.md", 15_000)])
def test_the_index_pages_stay_short(page: str, limit: int) -> None:
    size = len((REPO / page).read_bytes())
    assert size <= limit, f"{page} is {size} bytes (limit {limit}): move detail to a page under docs/"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(REPO)}")
    assert not broken, f"{_rel(page)}:\n" + "\n".join(broken)


def _field(record: Any, path: str) -> Any:
    """``a.b.0.c``, ``rows[seed=1,variant=defaults].x`` and ``fits["4.8588"].x`` (a key holding dots) into a JSON
    record."""
    value = record
    for part in re.findall(r"[^.\[\]]+(?:\[[^\]]*\])?", path):
        name, _, select = part.partition("[")
        if name:
            value = value[int(name)] if isinstance(value, list) else value[name]
        if select.startswith('"'):
            value = value[select.rstrip("]").strip('"')]
        elif select:
            wanted = dict(kv.split("=") for kv in select.rstrip("]").split(","))
            matches = [v for v in value if all(str(v.get(k)) == w for k, w in wanted.items())]
            assert len(matches) == 1, f"{path}: {len(matches)} entries match [{select}"
            value = matches[0]
    return value


def _close(printed: str, actual: float, *, scale: float) -> bool:
    decimals = len(printed.partition(".")[2])
    return abs(float(printed) - actual * scale) <= 0.5 * 10 ** -decimals * 1.02 + 1e-12


def _figure_rows() -> list[tuple[str, list[str]]]:
    rows = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() != FIGURES_HEADER:
                continue
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append((f"{_rel(page)}: {row[:60]}", [c.strip() for c in row.strip().strip("|").split(" | ")]))
    return rows


FIGURE_ROWS = _figure_rows()


def test_the_study_pages_have_figure_tables() -> None:
    pages = {where.split(":")[0] for where, _ in FIGURE_ROWS}
    studies = {_rel(p) for p in (DOCS / "studies").glob("*.md")}
    assert studies and not studies - pages, f"study pages without a checked figure table: {sorted(studies - pages)}"


@pytest.mark.parametrize(("where", "cells"), FIGURE_ROWS, ids=[w for w, _ in FIGURE_ROWS])
def test_every_tabled_figure_is_its_records(where: str, cells: list[str]) -> None:
    page = REPO / where.split(":")[0]
    assert len(cells) == 4, f"{where}: expected 4 cells"
    _, value, record_cell, machine_cell = cells
    value_match = VALUE.match(value)
    assert value_match, f"{where}: value {value!r} is not a number, 'mean ± std', or either with a unit"
    link = re.search(r"\]\(([^)]+)\)", record_cell)
    field = FIELD.search(record_cell.split(")", 1)[-1])
    assert link and field, f"{where}: the record cell needs [file](path) and `field`"
    path = (page.parent / link[1]).resolve()
    assert path.is_file(), f"{where}: no record at {link[1]}"
    record = json.loads(path.read_text(encoding="utf-8"))
    actual = _field(record, field[1])
    scale = 100.0 if value_match["unit"] == "%" else 1.0
    if value_match["std"] is not None:
        assert isinstance(actual, dict) and {"mean", "std"} <= set(actual), f"{where}: {field[1]} is no spread"
        assert _close(value_match["num"], actual["mean"], scale=scale), f"{where}: mean {actual['mean']}"
        assert _close(value_match["std"], actual["std"], scale=scale), f"{where}: std {actual['std']}"
    else:
        assert isinstance(actual, (int, float)), f"{where}: {field[1]} is {actual!r}, not a number"
        assert _close(value_match["num"], actual, scale=scale), f"{where}: the record says {actual}"
    machine = record.get("machine") if isinstance(record, dict) else None
    if isinstance(machine, dict) and machine.get("date"):
        assert machine["date"][:10] in machine_cell, f"{where}: the record was made on {machine['date'][:10]}"
        names = [n for n in (machine.get("gpu"), machine.get("cpu_model")) if n]
        assert any(n.split("(")[0].strip() in machine_cell for n in names), f"{where}: made on {names}"
    else:
        assert re.search(r"\d{4}-\d{2}-\d{2}", machine_cell), f"{where}: name the date the figure was made"


def _config_reference() -> Any:
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_page_lists_every_kfacconfig_field_as_the_code_has_it() -> None:
    import dataclasses

    from kaisa_ds import KFACConfig

    reference = _config_reference()
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(\w+)` \|", page[page.index(reference.BEGIN):], flags=re.M))
    fields = {f.name for f in dataclasses.fields(KFACConfig) if f.init}
    assert not fields - listed, (f"KFACConfig fields missing from docs/configuration.md: {sorted(fields - listed)}; "
                                 "run .venv/bin/python scripts/config_reference.py")
    assert not listed - fields, f"docs/configuration.md lists keys KFACConfig lacks: {sorted(listed - fields)}"
    assert reference.rendered(page) == page, ("docs/configuration.md's table differs from KFACConfig (a default, "
                                              "type or docstring changed): run scripts/config_reference.py")


def _kfac_examples() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for block in re.findall(r"```json\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            if '"kfac"' in block:
                out.append((_rel(page), block))
    return out


@pytest.mark.parametrize(("page", "block"), _kfac_examples(), ids=[p for p, _ in _kfac_examples()])
def test_every_kfac_json_example_is_a_section_the_engine_accepts(page: str, block: str) -> None:
    from kaisa_ds.engine.ds_config import parse_kfac_section

    section = parse_kfac_section(json.loads("{" + block.strip().rstrip(",") + "}"))
    assert section.enabled and section.config is not None, page


def test_the_docs_index_names_every_page() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in _links(DOCS / "README.md") if not t.startswith("http")}
    pages = {p.resolve() for p in DOCS.rglob("*.md") if p.name != "README.md"}
    assert not pages - linked, f"pages docs/README.md does not link: {sorted(str(p) for p in pages - linked)}"
    assert "docs/README.md" in (REPO / "README.md").read_text(encoding="utf-8") and index


def _benchmark_commands() -> set[str]:
    """``benchmarks.<name>`` for every runnable benchmark: a module or package with a command line."""
    out = set()
    for path in sorted((REPO / "benchmarks").iterdir()):
        if path.name in ("harness", "results", "__pycache__") or path.name.startswith("_"):
            continue
        if path.is_dir() and (path / "__main__.py").is_file():
            out.add(f"benchmarks.{path.name}")
            out |= {f"benchmarks.{path.name}.{m.stem}" for m in path.glob("*.py")  # cli.py: the package's own
                    if m.stem != "cli" and 'if __name__ == "__main__"' in m.read_text(encoding="utf-8")}
        elif path.suffix == ".py" and 'if __name__ == "__main__"' in path.read_text(encoding="utf-8"):
            out.add(f"benchmarks.{path.stem}")
    return out


def test_the_benchmarks_index_names_every_benchmark_and_its_page() -> None:
    index = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    commands = _benchmark_commands()
    assert len(commands) >= 12, commands
    missing = sorted(c for c in commands if f"python -m {c}" not in index)
    assert not missing, f"benchmarks/README.md does not name: {missing}"
    linked = [t for t in _links(REPO / "benchmarks" / "README.md") if "docs/studies/" in t]
    assert len({t.partition("#")[0] for t in linked}) >= 10, "the index links too few study pages"


def _manifest_rows() -> list[tuple[list[str], str, str]]:
    """``(patterns, command, line)`` of benchmarks/results/README.md's table (patterns: the first cell's code spans)."""
    rows = []
    for line in (RESULTS / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) >= 3:
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1], line))
    return rows


def _matches(pattern: str, path: str) -> bool:
    """Glob matching on posix paths: ``*`` within a folder, ``**`` across folders."""
    regex = re.escape(pattern).replace(r"\*\*", "\0").replace(r"\*", "[^/]*").replace("\0", ".*")
    return re.fullmatch(regex, path) is not None


def test_every_shipped_record_says_which_command_wrote_it() -> None:
    rows = _manifest_rows()
    assert len(rows) >= 20
    files = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*")
                   if p.is_file() and p != RESULTS / "README.md")
    patterns = [pattern for row_patterns, _, _ in rows for pattern in row_patterns]
    unclaimed = [f for f in files if not any(_matches(pattern, f) for pattern in patterns)]
    assert not unclaimed, f"files under benchmarks/results no row of its README claims: {unclaimed[:20]}"
    unmatched = [pattern for pattern in patterns if not any(_matches(pattern, f) for f in files)]
    assert not unmatched, f"rows of benchmarks/results/README.md that match no file: {unmatched}"
    for _, command, line in rows:
        assert re.search(r"python -m |bash |scripts/|by hand|py-spy", command), f"no command in: {line}"
