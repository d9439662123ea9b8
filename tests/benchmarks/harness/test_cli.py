"""The flags step_cost and versus_kfac_pytorch share are checked alike: a bad value is a usage error (exit 2)
before any model is built, in both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from benchmarks.step_cost.cli import main as step_cost_main
from benchmarks.versus_kfac_pytorch.cli import parse_args as versus_parse_args

BENCHMARKS: dict[str, Callable[[list[str]], Any]] = {"step_cost": step_cost_main, "versus": versus_parse_args}


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
@pytest.mark.parametrize("argv", [
    ["--factor-every", "5", "--inv-every", "7"],  # not a multiple
    ["--factor-every", "0"],
    ["--repeats", "0"],
    ["--batch", "0"],
    ["--seq", "1"],
    ["--threads", "0"],
    ["--inv-dtype", "fp8"],
])
def test_bad_shared_flags_are_usage_errors_in_both(benchmark: str, argv: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        BENCHMARKS[benchmark](argv)
    assert exc.value.code == 2
    assert "usage: python -m benchmarks." in capsys.readouterr().err
