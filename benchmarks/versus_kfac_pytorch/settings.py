"""What both libraries are given (issue 9: "the same model, batch and intervals") and the stages compared."""

from __future__ import annotations

from kaisa_ds.enums import ComputeMethod, Grafting

DAMPING = 0.001
FACTOR_DECAY = 0.95
KL_CLIP = 0.001
GRAFTING = Grafting.NONE  # kfac-pytorch has no grafting: both take K-FAC's own step, KL-clipped
COMPUTE_METHOD = ComputeMethod.EIGEN
LIBRARIES = ("kaisa_ds", "kfac-pytorch")
# stages of precond.step(); factor_capture runs in the hooks, inside forward+backward
STEP_STAGES = ("decomposition", "preconditioning", "kl_clip", "write_grads")
STAGE_NAMES = ("factor_capture", *STEP_STAGES)  # what each runner reports of its own stages
COMPONENTS = ("factor_capture", "hook_machinery", *STEP_STAGES, "step_other")
