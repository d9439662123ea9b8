"""``python -m mission``: see mission/run.py."""

from mission.run import main

raise SystemExit(main())
