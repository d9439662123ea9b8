"""``python -m squad_finetune``: see :mod:`squad_finetune.cli`."""

import sys

from squad_finetune.cli import main

sys.exit(main())
