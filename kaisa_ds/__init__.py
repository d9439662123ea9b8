"""kaisa_ds: distributed K-FAC (KAISA) gradient preconditioning for PyTorch and DeepSpeed.

``KFACPreconditioner`` works with any torch optimizer, single-process or under ``torch.distributed``;
``initialize`` is a drop-in for ``deepspeed.initialize`` that reads the config's ``kfac`` section;
``enable_kfac(trainer)`` and ``attach_to_accelerator(accelerator)`` do the same for the HF Trainer and accelerate.
Heavy modules (DeepSpeed) are imported lazily so ``import kaisa_ds`` stays cheap. Every name in ``__all__`` is
described, argument by argument, in docs/API.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kaisa_ds.config import KFACConfig
from kaisa_ds.enums import ComputeMethod, DampingMode, DistributedStrategy, Eigenvalues, Grafting, LossReduction
from kaisa_ds.schedules import StepSchedule

if TYPE_CHECKING:
    from kaisa_ds.engine.deepspeed_engine import initialize
    from kaisa_ds.engine.launch import init_distributed
    from kaisa_ds.hf.accelerate import attach_to_accelerator
    from kaisa_ds.hf.trainer import enable_kfac
    from kaisa_ds.preconditioner import KFACPreconditioner

__all__ = [
    "ComputeMethod",
    "DampingMode",
    "DistributedStrategy",
    "Eigenvalues",
    "Grafting",
    "KFACConfig",
    "KFACPreconditioner",
    "LossReduction",
    "StepSchedule",
    "attach_to_accelerator",
    "enable_kfac",
    "init_distributed",
    "initialize",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "KFACPreconditioner":
        from kaisa_ds.preconditioner import KFACPreconditioner

        return KFACPreconditioner
    if name == "initialize":
        from kaisa_ds.engine.deepspeed_engine import initialize

        return initialize
    if name == "enable_kfac":
        from kaisa_ds.hf.trainer import enable_kfac

        return enable_kfac
    if name == "attach_to_accelerator":
        from kaisa_ds.hf.accelerate import attach_to_accelerator

        return attach_to_accelerator
    if name == "init_distributed":
        from kaisa_ds.engine.launch import init_distributed

        return init_distributed
    raise AttributeError(f"module 'kaisa_ds' has no attribute {name!r}")
