"""run_forked: a preparation step in a child process: its answer and its errors come back, its heap does not."""

from __future__ import annotations

import os

import pytest

from bert_pretrain.data.errors import DataError
from bert_pretrain.data.forked import run_forked

HELD: list[bytes] = []


def _hold_and_answer() -> int:
    HELD.append(bytes(1 << 20))  # what the step leaves behind
    return os.getpid()


def test_the_step_runs_in_a_child_whose_leftovers_stay_there() -> None:
    assert run_forked(_hold_and_answer, what="step") != os.getpid()
    assert HELD == []


def test_the_childs_error_is_raised_here_with_its_message() -> None:
    def bad() -> None:
        raise DataError("--data corpus.txt: not UTF-8 at byte 12")

    with pytest.raises(DataError, match=r"corpus\.txt: not UTF-8"):
        run_forked(bad, what="tokenising")


def test_a_child_that_dies_is_an_error_naming_the_step() -> None:
    with pytest.raises(RuntimeError, match=r"tokenising: its process died without an answer \(exit code 3"):
        run_forked(lambda: os._exit(3), what="tokenising")
