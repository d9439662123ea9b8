"""``python -m benchmarks.versus_kfac_pytorch``: see benchmarks/versus_kfac_pytorch/cli.py."""

from benchmarks.versus_kfac_pytorch.cli import main

main()
