"""Counting what a step would make a GPU wait for, on the CPU: every read of a tensor's value by the host (``item``,
``bool``, ``float``, ``tolist``, ``nonzero``, ...) is a host sync on a GPU, and every dispatched operator a kernel
launch. A flag's host copy (:class:`kaisa_ds.timing.HostFlag`) is read without waiting and is not counted."""

from __future__ import annotations

import traceback
from typing import Any

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from kaisa_ds.timing import HostFlag

SYNCING = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero", "numpy", "cpu"}


class HostSyncs(TorchFunctionMode):
    """Within the ``with`` block, ``calls`` lists every host read of a tensor, with where it happened."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in SYNCING and not (args and HostFlag.is_host_copy(args[0])):
            frame = traceback.extract_stack()[-2]
            self.calls.append((name, f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno}"))
        return func(*args, **(kwargs or {}))


class Launches(TorchDispatchMode):
    """Within the ``with`` block, ``count`` is the number of operators dispatched (kernels a GPU would launch)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))
