"""``python -m benchmarks.step_cost``: see benchmarks/step_cost/cli.py."""

from benchmarks.step_cost.cli import main

main()
