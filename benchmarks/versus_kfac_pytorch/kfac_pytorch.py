"""The kfac-pytorch adapter: importing it (never installed by this project), its version, and its
KFACPreconditioner behind the harness's Runner calls, its stages timed by wrapping its layer methods."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from benchmarks.versus_kfac_pytorch.settings import (
    COMPUTE_METHOD,
    DAMPING,
    FACTOR_DECAY,
    KL_CLIP,
    STAGE_NAMES,
)
from kaisa_ds.enums import DTYPES
from kaisa_ds.plan.bert_sizes import KAISA_SKIP
from kaisa_ds.timing import StageTimer

INSTALL = """\
kfac-pytorch (module `kfac`) is not importable. It is not a dependency of this project and is never installed
by it; install it into a scratch directory outside the repository, leaving this environment's packages alone:
  1. get its source, e.g.  git clone https://github.com/gpauloski/kfac-pytorch /tmp/kfac-pytorch-src
     (or export a fetched mirror: git --git-dir=<mirror> archive HEAD | tar -x -C /tmp/kfac-pytorch-src)
  2. python -m pip install --no-deps --target /tmp/kfp-site /tmp/kfac-pytorch-src
     (its only dependency is torch, already here; --no-deps keeps pip from touching anything else)
  3. run with it on the path:
     PYTHONPATH=$PWD:/tmp/kfp-site python -m benchmarks.versus_kfac_pytorch ..."""

# kfac-pytorch layer methods and the stage each one belongs to
KFP_STAGE_OF = {
    "save_layer_input": "factor_capture", "save_layer_grad_output": "factor_capture",
    "update_a_factor": "factor_capture", "update_g_factor": "factor_capture",
    "reduce_a_factor": "factor_capture", "reduce_g_factor": "factor_capture",
    "compute_a_inv": "decomposition", "compute_g_inv": "decomposition",
    "preconditioned_grad": "preconditioning", "update_grad": "write_grads",
}
KFP_FACTOR_ATTRS = ("_a_factor", "_g_factor", "_a_batch", "_g_batch")
KFP_DECOMPOSITION_ATTRS = ("_qa", "_qg", "_da", "_dg", "_dgda")


def import_kfac() -> ModuleType:
    """kfac-pytorch's preconditioner module, or SystemExit with the install steps (it is never installed here)."""
    try:
        with warnings.catch_warnings():  # "NVIDIA Apex is not installed": irrelevant on one process
            warnings.simplefilter("ignore")
            import kfac.preconditioner as kfp
    except ImportError as exc:
        raise SystemExit(f"{INSTALL}\n(import error: {exc})") from None
    return kfp


def kfac_version() -> str | None:
    """The installed kfac-pytorch distribution's version, so a result names what it was compared with."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kfac_pytorch")
    except PackageNotFoundError:
        return None


class KfpRunner:
    """kfac-pytorch's KFACPreconditioner; its layer methods are wrapped (per instance) to time its stages."""

    name = "kfac-pytorch"

    def __init__(self, model: torch.nn.Module, *, factor_every: int, inv_every: int, lr: float, cuda: bool,
                 kfp: ModuleType, inv_dtype: str = "fp32", prediv: bool = True) -> None:
        self.model = model
        self.precond = kfp.KFACPreconditioner(
            model, factor_update_steps=factor_every, inv_update_steps=inv_every, damping=DAMPING,
            factor_decay=FACTOR_DECAY, kl_clip=KL_CLIP, lr=lr, accumulation_steps=1,
            compute_method=COMPUTE_METHOD.value, skip_layers=list(KAISA_SKIP), loglevel=logging.DEBUG,
            inv_dtype=DTYPES[inv_dtype], compute_eigenvalue_outer_product=prediv)
        self.timer = StageTimer()  # kaisa_ds's own stage timer, so both libraries' stages are timed alike
        self.timer.sync = cuda
        for _, layer in self.precond._layers.values():
            for method, stage in KFP_STAGE_OF.items():
                setattr(layer, method, self._timed(getattr(layer, method), stage))
        self.precond._compute_grad_scale = self._timed(self.precond._compute_grad_scale, "kl_clip")

    def _timed(self, fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.timer.stage(stage):
                return fn(*args, **kwargs)

        return wrapper

    def set_step(self, step: int) -> None:
        self.precond._steps = step  # its hooks read `steps` (a property over _steps)
        self.timer.reset()

    def step(self) -> None:
        self.precond.step()

    def stages(self) -> dict[str, float]:
        return {s: self.timer.seconds.get(s, 0.0) for s in STAGE_NAMES}

    def layer_names(self) -> list[str]:
        return [name for name, _ in self.precond._layers.values()]

    def memory(self) -> dict[str, int]:
        """Bytes of every tensor its layer objects hold, as factors (running averages and batch buffers),
        decompositions (eigenvectors, eigenvalues, the cached 1/(dg daᵀ + damping)) or other."""
        out = {"factors": 0, "decompositions": 0, "other": 0}
        seen: set[int] = set()
        for _, layer in self.precond._layers.values():
            for attr, value in vars(layer).items():
                if not isinstance(value, torch.Tensor) or value.data_ptr() in seen:
                    continue
                seen.add(value.data_ptr())
                kind = ("factors" if attr in KFP_FACTOR_ATTRS else
                        "decompositions" if attr in KFP_DECOMPOSITION_ATTRS else "other")
                out[kind] += value.numel() * value.element_size()
        out["own_memory_usage_total"] = int(self.precond.memory_usage()["total"])  # its own count, to cross-check
        return out
