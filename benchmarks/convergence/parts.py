"""Split text files into three disjoint parts: training text, a tuning part and a report part.

Hyperparameters are chosen on the tuning part and the figures are reported on the report part, which no choice
ever looked at. The unit of the split is an article for WikiText (a top-level ``= Title =`` heading and all its
sections, so no article straddles two parts) and for a SQuAD JSON file (its paragraphs' contexts under a
``= Title =`` heading), and a blank-line-separated block for any other text. The units of all the sources are
pooled and cut by a seeded shuffle, the same on every machine. The part files keep the WikiText format, so
bert_pretrain reads their documents exactly as it would read the sources; when headed and headless sources are
mixed, each headless block gets a heading of its own, so it stays one document there too.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert_pretrain.data.documents import HEADING
from squad_finetune.squad_json import SquadFormatError, read_squad_file

PARTS = ("train", "tune", "report")
TOP_HEADING = re.compile(r"^\s*=\s[^=].*\s=\s*$")  # WikiText article title: exactly one '=' each side
MIN_UNITS = 3  # bert_pretrain needs at least 3 documents per file


class SplitError(ValueError):
    """The text cannot be split into three usable parts; the message says why."""


def units(text: str) -> list[str]:
    """The text's split units, in order: WikiText articles, or blank-line blocks (each without trailing space)."""
    lines = text.splitlines()
    if any(HEADING.match(line) for line in lines):  # bert_pretrain's own test for a WikiText file
        out: list[list[str]] = []
        for line in lines:
            if TOP_HEADING.match(line) or not out:
                out.append([])
            out[-1].append(line)
        chunks = ["\n".join(u).strip("\n") for u in out]
    else:
        chunks = [c.strip("\n") for c in re.split(r"\n\s*\n", text)]
    return [c for c in chunks if c.strip()]


def assign(n: int, *, fractions: tuple[float, float, float], seed: int) -> dict[str, list[int]]:
    """Unit indices of each part: a seeded shuffle cut by ``fractions`` (train, tune, report), sorted."""
    if n < MIN_UNITS * len(PARTS):
        raise SplitError(f"the text has {n} split units (articles or blank-line blocks); at least "
                         f"{MIN_UNITS * len(PARTS)} are needed for three parts of {MIN_UNITS}")
    if any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise SplitError(f"fractions {fractions} must be positive and sum to 1")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    tune = max(MIN_UNITS, round(n * fractions[1]))
    report = max(MIN_UNITS, round(n * fractions[2]))
    if n - tune - report < MIN_UNITS:
        raise SplitError(f"{n} units leave fewer than {MIN_UNITS} for training; give more text")
    cuts = {"tune": order[:tune], "report": order[tune:tune + report], "train": order[tune + report:]}
    return {part: sorted(cuts[part]) for part in PARTS}


def source_units(path: Path) -> list[str]:
    """The split units of one source file: a SQuAD JSON file's articles (title heading, then each paragraph's
    context as one line, its line breaks made spaces: "O\\n2" would otherwise be two paragraphs), or :func:`units`
    of a text file."""
    if path.suffix == ".json":
        try:
            squad = read_squad_file(path, check_spans=False)
        except SquadFormatError as exc:
            raise SplitError(f"--text {path}: a .json source must be a SQuAD v1.1 file ({exc})") from exc
        return [f" = {article['title'].replace('_', ' ')} = \n\n" + "\n\n".join(
            " ".join(p["context"].split()) for p in article["paragraphs"]) for article in squad.data]
    return units(path.read_text(encoding="utf-8", errors="replace"))


def headed(unit: str) -> bool:
    return any(HEADING.match(line) for line in unit.splitlines())


def harmonise(chunks: list[tuple[str, str]]) -> list[str]:
    """The units as one text format: when some (source stem, unit) pairs have WikiText headings and others have
    none, a headless unit gets a heading of its own; in a headed file bert_pretrain would otherwise merge it into
    the section before it (blank lines only separate paragraphs there)."""
    flags = [headed(u) for _, u in chunks]
    if not any(flags):
        return [u for _, u in chunks]
    return [u if flag else f" = {stem} {i} = \n\n{u}" for i, ((stem, u), flag) in enumerate(zip(chunks, flags))]


def source_digests(texts: Sequence[Path]) -> list[str]:
    """The sha256 of each source's bytes; a missing file is an error naming it."""
    if not texts:
        raise SplitError("--text names no file")
    for text in texts:
        if not text.is_file():
            raise SplitError(f"--text {text} does not exist (the default is the regime's texts under ../shared/data)")
    return [hashlib.sha256(t.read_bytes()).hexdigest() for t in texts]


def pooled_digest(digests: list[str]) -> str:
    """One source: its own digest (as recorded before several sources were possible, so old records stay valid);
    several: the sha256 of their digests in order."""
    return digests[0] if len(digests) == 1 else hashlib.sha256("\n".join(digests).encode()).hexdigest()


FRACTIONS = (0.7, 0.15, 0.15)


def split_recipe(*, fractions: Sequence[float] = FRACTIONS, seed: int = 0,
                 max_units: int | None = None) -> dict[str, Any]:
    """What, besides the sources, decides the parts' contents (JSON-comparable)."""
    return {"fractions": list(fractions), "seed": seed, "max_units": max_units}


@dataclass(frozen=True)
class Parts:
    """The three part files and the manifest that says how they were made."""

    folder: Path
    source_sha256: str
    units: dict[str, list[int]]
    # how the pooled units were cut (the defaults of write_parts: the full-scale split); with source_sha256 it
    # names the part files' contents, so it belongs to a recorded run's key
    recipe: dict[str, Any] = field(default_factory=lambda: split_recipe())

    def path(self, part: str) -> Path:
        return self.folder / f"{part}.txt"


def write_parts(texts: Path | Sequence[Path], root: Path, *,
                fractions: tuple[float, float, float] = FRACTIONS, seed: int = 0,
                max_units: int | None = None) -> Parts:
    """Write ``{train,tune,report}.txt`` and ``parts.json`` into ``root/<the sources' digest, 12 hex>/`` (with
    ``_first<max_units>`` for a partial split), so different texts and splits keep their own parts; files are
    rewritten only when they change.

    ``texts``: one source file or several (their units pooled in order). ``max_units``: split only the pooled
    units' first (the smoke test's toy scale)."""
    texts = [texts] if isinstance(texts, Path) else list(texts)
    digests = source_digests(texts)
    digest = pooled_digest(digests)
    folder = root / (digest[:12] + (f"_first{max_units}" if max_units else ""))  # a toy split never replaces
    per_source = [[(text.stem, u) for u in source_units(text)] for text in texts]
    chunks = harmonise([c for source in per_source for c in source])[:max_units]
    chosen = assign(len(chunks), fractions=fractions, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    for part, indices in chosen.items():
        body = "\n\n".join(chunks[i] for i in indices) + "\n"
        path = folder / f"{part}.txt"
        if not path.is_file() or path.read_text(encoding="utf-8") != body:  # keep mtimes: prepared data is reused
            path.write_text(body, encoding="utf-8")
    manifest = {"sources": [{"path": str(t.resolve()), "sha256": d, "units": len(s)}
                            for t, d, s in zip(texts, digests, per_source, strict=True)],
                "sources_sha256": digest, "seed": seed, "fractions": list(fractions), "max_units": max_units,
                "units": len(chunks), "unit_indices": chosen}
    (folder / "parts.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return Parts(folder=folder, source_sha256=digest, units=chosen,
                 recipe=split_recipe(fractions=fractions, seed=seed, max_units=max_units))
