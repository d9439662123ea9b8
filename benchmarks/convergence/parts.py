"""Split one text file into three disjoint parts: training text, a tuning part and a report part.

Hyperparameters are chosen on the tuning part and the figures are reported on the report part, which no choice
ever looked at. The unit of the split is an article for WikiText (a top-level ``= Title =`` heading and all its
sections, so no article straddles two parts) and a blank-line-separated block for any other text. The split is
a seeded shuffle of the units, the same on every machine; the part files keep the source format, so
bert_pretrain reads their documents exactly as it would read the source.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

PARTS = ("train", "tune", "report")
TOP_HEADING = re.compile(r"^\s*=\s[^=].*\s=\s*$")  # WikiText article title: exactly one '=' each side
ANY_HEADING = re.compile(r"^\s*(=+)\s.*\s\1\s*$")
MIN_UNITS = 3  # bert_pretrain needs at least 3 documents per file


class SplitError(ValueError):
    """The text cannot be split into three usable parts; the message says why."""


def units(text: str) -> list[str]:
    """The text's split units, in order: WikiText articles, or blank-line blocks (each without trailing space)."""
    lines = text.splitlines()
    if any(ANY_HEADING.match(line) for line in lines):
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


@dataclass(frozen=True)
class Parts:
    """The three part files and the manifest that says how they were made."""

    folder: Path
    source_sha256: str
    units: dict[str, list[int]]

    def path(self, part: str) -> Path:
        return self.folder / f"{part}.txt"


def write_parts(text: Path, folder: Path, *, fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
                seed: int = 0, max_units: int | None = None) -> Parts:
    """Write ``folder/{train,tune,report}.txt`` and ``parts.json``; files are rewritten only when they change.

    ``max_units``: split only the text's first units (the smoke test's toy scale)."""
    if not text.is_file():
        raise SplitError(f"--text {text} does not exist (the default is ../shared/data/wikitext-2/valid.txt)")
    raw = text.read_text(encoding="utf-8", errors="replace")
    chunks = units(raw)[:max_units]
    chosen = assign(len(chunks), fractions=fractions, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    for part, indices in chosen.items():
        body = "\n\n".join(chunks[i] for i in indices) + "\n"
        path = folder / f"{part}.txt"
        if not path.is_file() or path.read_text(encoding="utf-8") != body:  # keep mtimes: prepared data is reused
            path.write_text(body, encoding="utf-8")
    digest = hashlib.sha256(raw.encode()).hexdigest()
    manifest = {"source": str(text.resolve()), "source_sha256": digest, "seed": seed, "fractions": list(fractions),
                "max_units": max_units,
                "units": len(chunks), "unit_indices": chosen}
    (folder / "parts.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return Parts(folder=folder, source_sha256=digest, units=chosen)
