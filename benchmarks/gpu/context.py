"""What every part of the GPU suite gets: where to write, the device, toy or real shapes, and the time left."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.output import write_json


@dataclass
class Context:
    out: Path
    smoke: bool
    args: argparse.Namespace
    deadline: float  # time.monotonic() by which the call must be done (the device call's limit, less a margin)
    device: torch.device = field(init=False)

    def __post_init__(self) -> None:
        self.device = torch.device("cpu" if self.smoke else "cuda")

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def write(self, name: str, data: dict[str, Any]) -> Path:
        """``<out>/gpu_<name>.json``: written after every finished measurement, so a call cut short keeps them."""
        path = self.out / f"gpu_{name}.json"
        write_json(data, path)
        return path

    def figure(self, name: str) -> tuple[Any, Path]:
        """A matplotlib figure (Agg backend: no display there) and the PNG path to save it to."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(9, 5))
        return fig, self.out / f"gpu_{name}.png"


def save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
