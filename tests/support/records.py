"""Committed study records the tests rebuild: a rule's choice must follow from the records it was made from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.launch import REPO_ROOT

CONVERGENCE = REPO_ROOT / "benchmarks" / "results" / "convergence"


def committed_choice(name: str, *, what: str) -> tuple[Path, dict[str, Any]]:
    """The study's results root and the committed ``name`` record; the test skips while ``what`` is unrecorded."""
    record = CONVERGENCE / name
    if not record.is_file():
        pytest.skip(f"{what} is not recorded yet")
    return CONVERGENCE, json.loads(record.read_text())
