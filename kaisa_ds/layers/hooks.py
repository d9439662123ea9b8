"""Forward hooks (and per-output tensor hooks) that report layer inputs and output gradients.

Only an input's statistics are needed, never the activation itself, so callbacks run inside the
hooks and nothing is kept alive until the backward pass. The capture also notices layers that read
the very same input tensor object in one pass (a transformer's query/key/value projections), so
their A factor can be shared.

Passes: a forward pre-hook on the model numbers its forward passes, and every callback is told the pass its tensor
belongs to (an output gradient: the pass that made the output). A module called k times in one pass (ALBERT's one
shared layer, a weight-tied block, a recomputed checkpointed block) then adds k calls' rows to one pass of its
factors, the "expand" setting of Eschenhagen et al. (NeurIPS 2023): each call's rows are samples. Without the model
hook (a capture used on its own) every call is a pass of its own (``pass_id`` None).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from kaisa_ds.layers.lookup import LookupRecorder

InputCallback = Callable[[str, torch.Tensor, int | None], None]  # (layer, input, forward pass id)
GradCallback = Callable[[str, torch.Tensor, int | None], None]  # (layer, output gradient, its forward pass id)


def _first_tensor(values: Any, depth: int = 2) -> torch.Tensor | None:
    """The first tensor of rank ≥ 1 among ``values``, looking into dicts, lists and tuples (a batch dict)."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value
        if depth and isinstance(value, (dict, list, tuple)):
            found = _first_tensor(value.values() if isinstance(value, dict) else value, depth - 1)
            if found is not None:
                return found
    return None


class HookCapture:
    """Registers the hooks and forwards tensors to callbacks while ``enabled()`` is true."""

    def __init__(self, *, enabled: Callable[[], bool], on_input: InputCallback, on_output_grad: GradCallback) -> None:
        self._enabled = enabled
        self._on_input = on_input
        self._on_output_grad = on_output_grad
        self._handles: dict[str, list[RemovableHandle]] = {}
        self.fired: set[str] = set()
        self.same_input: dict[str, str] = {}  # layer -> earlier layer that read the same tensor object
        self._recent: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._reader: dict[int, str] = {}
        self.seconds = 0.0  # time spent in callbacks since the last reset
        self.pass_id: int | None = None  # the model's current forward pass (None: no model hook, or none yet)
        self.samples: int | None = None  # the batch dimension of the model's first tensor input, last pass
        self.calls: dict[str, int] = {}  # layer -> the most calls it had in one forward pass
        self._calls_now: dict[str, int] = {}
        self._root: RemovableHandle | None = None

    def attach_model(self, model: nn.Module) -> None:
        """Number the forward passes of ``model`` (the root of every attached layer)."""
        if self._root is not None:
            self._root.remove()
        self._root = model.register_forward_pre_hook(self._new_pass, with_kwargs=True)

    def _new_pass(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.pass_id = 0 if self.pass_id is None else self.pass_id + 1
        self._calls_now = {}
        first = _first_tensor((*args, *kwargs.values()))
        self.samples = int(first.shape[0]) if first is not None else self.samples  # batch-first inputs

    @property
    def multi_call(self) -> dict[str, int]:
        """Layers called more than once in one forward pass, and the most calls seen."""
        return {n: c for n, c in self.calls.items() if c > 1}

    def take_seconds(self) -> float:
        """Seconds spent in the callbacks since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def attach(self, name: str, module: nn.Module, *, lookup: bool = False) -> None:
        """Report ``module``'s input (with ``lookup``: the ids its ``F.embedding`` call looks up) and output
        gradient under ``name``."""
        if not lookup:
            self._handles[name] = [module.register_forward_hook(self._make_hook(name))]
            return
        recorder = LookupRecorder(module.weight)  # type: ignore[arg-type]

        def start(_: nn.Module, inputs: tuple[Any, ...]) -> None:
            recorder.ids = None
            recorder.__enter__()

        def stop(mod: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            recorder.__exit__(None, None, None)  # always called, also when the forward raised
            if recorder.ids is not None:
                hook(mod, (recorder.ids,), output)

        hook = self._make_hook(name)
        self._handles[name] = [module.register_forward_pre_hook(start),
                               module.register_forward_hook(stop, always_call=True)]

    def detach(self, name: str) -> None:
        for handle in self._handles.pop(name, []):
            handle.remove()

    def remove_all(self) -> None:
        for name in list(self._handles):
            self.detach(name)
        if self._root is not None:
            self._root.remove()
            self._root = None

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
            if self.pass_id is not None:
                calls = self._calls_now[name] = self._calls_now.get(name, 0) + 1
                self.calls[name] = max(self.calls.get(name, 0), calls)
            inp = inputs[0]
            self._note_input(name, inp)
            self._on_input(name, inp, self.pass_id)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._make_grad_hook(name, self.pass_id))
            self.seconds += time.perf_counter() - start

        return hook

    def _make_grad_hook(self, name: str, pass_id: int | None) -> Callable[[torch.Tensor], None]:
        def grad_hook(grad: torch.Tensor) -> None:
            start = time.perf_counter()
            self._on_output_grad(name, grad, pass_id)
            self.seconds += time.perf_counter() - start

        return grad_hook
