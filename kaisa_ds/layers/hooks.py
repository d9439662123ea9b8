"""Forward hooks (and per-output tensor hooks) that report layer inputs and output gradients.

Only an input's statistics are needed, never the activation itself, so callbacks run inside the
hooks and nothing is kept alive until the backward pass. The capture also notices layers that read
the very same input tensor object in one pass (a transformer's query/key/value projections), so
their A factor can be shared.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

InputCallback = Callable[[str, torch.Tensor], None]
GradCallback = Callable[[str, torch.Tensor], None]


class HookCapture:
    """Registers the hooks and forwards tensors to callbacks while ``enabled()`` is true."""

    def __init__(self, *, enabled: Callable[[], bool], on_input: InputCallback, on_output_grad: GradCallback) -> None:
        self._enabled = enabled
        self._on_input = on_input
        self._on_output_grad = on_output_grad
        self._handles: dict[str, RemovableHandle] = {}
        self.fired: set[str] = set()
        self.same_input: dict[str, str] = {}  # layer -> earlier layer that read the same tensor object
        self._recent: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._reader: dict[int, str] = {}
        self.seconds = 0.0  # time spent in callbacks since the last reset

    def take_seconds(self) -> float:
        """Seconds spent in the callbacks since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def attach(self, name: str, module: nn.Module) -> None:
        self._handles[name] = module.register_forward_hook(self._make_hook(name))

    def detach(self, name: str) -> None:
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.remove()

    def remove_all(self) -> None:
        for name in list(self._handles):
            self.detach(name)

    def _note_input(self, name: str, inp: torch.Tensor) -> None:
        key = id(inp)
        seen = self._recent.get(key)
        if seen is inp and self._reader.get(key, name) != name:
            self.same_input.setdefault(name, self._reader[key])
        else:
            self._recent[key] = inp
            self._reader[key] = name

    def _make_hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            if not (module.training and torch.is_grad_enabled() and self._enabled()):
                return
            if not inputs or not isinstance(inputs[0], torch.Tensor):
                return
            start = time.perf_counter()
            self.fired.add(name)
            inp = inputs[0]
            self._note_input(name, inp)
            self._on_input(name, inp)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._make_grad_hook(name))
            self.seconds += time.perf_counter() - start

        return hook

    def _make_grad_hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def grad_hook(grad: torch.Tensor) -> None:
            start = time.perf_counter()
            self._on_output_grad(name, grad)
            self.seconds += time.perf_counter() - start

        return grad_hook
