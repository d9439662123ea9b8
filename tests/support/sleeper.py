"""A stand-in rank for launcher tests (tests/faults/test_launcher.py): writes its pid to
``<folder>/rank<LOCAL_RANK>.pid``, then sleeps, so a test can check that stopping the launch stops it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    folder = Path(next(a for a in sys.argv[1:] if not a.startswith("--local_rank")))
    (folder / f"rank{os.environ.get('LOCAL_RANK', '0')}.pid").write_text(str(os.getpid()))
    time.sleep(300)
