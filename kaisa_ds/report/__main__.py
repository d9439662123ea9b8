"""``python -m kaisa_ds.report``."""

from kaisa_ds.report.cli import main

main()
