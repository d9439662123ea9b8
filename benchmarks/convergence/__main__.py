"""``python -m benchmarks.convergence``: see benchmarks/convergence/cli.py."""

from benchmarks.convergence.cli import main

main()
