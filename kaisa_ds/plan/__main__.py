"""``python -m kaisa_ds.plan``."""

from kaisa_ds.plan.cli import main

main()
