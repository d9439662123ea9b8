"""Pure-PyTorch LAMB with the semantics of NVIDIA Apex ``FusedLAMB``, for machines without Apex or CUDA.

Follows NVIDIA/apex ``apex/optimizers/fused_lamb.py`` (step) and ``csrc/multi_tensor_lamb.cu``
(``LAMBStage1Functor``, ``LAMBStage2Functor``, ``multi_tensor_lamb_cuda``):

1. one global L2 norm over the gradients of ALL groups; every gradient is divided by
   ``norm / max_grad_norm`` when ``norm > max_grad_norm`` (stage 1, ``clipped_global_grad_norm``);
2. Adam moments ``m = β1·m + β3·g``, ``v = β2·v + (1−β2)·g²`` with ``β3 = 1−β1`` under grad averaging, and
   bias correction ``1−β^t`` where ``t`` is the group's step count, which Apex bumps for every group on
   every ``step()`` call, with or without gradients;
3. ``update = m̂ / (√v̂ + eps)`` plus ``weight_decay·p`` (AdamW mode) — in L2 mode the decay is added to
   the clipped gradient before the moments instead;
4. per-tensor trust ratio ``‖p‖ / ‖update‖`` (1 when either norm is 0), applied only where the group's
   weight decay is non-zero unless ``use_nvlamb`` (stage 2); ``p ← p − lr·ratio·update``.

Deviations, on purpose: ``max_grad_norm = 0`` disables the pre-normalisation (DeepSpeed's convention for
that key; Apex would divide by zero); Apex writes the update into ``p.grad``, this leaves gradients
untouched; fp16/bf16 parameters are accepted (Apex refuses bf16) with the arithmetic in fp32 as Apex's
``MATH_T`` and the moments stored in the parameter's dtype as Apex does.

Everything is foreach/batched tensor ops: no host synchronisation and no per-parameter kernel for the
norms or the trust ratios.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

APEX_MAX_GRAD_NORM = 1.0  # Apex FusedLAMB's default global-norm threshold (DeepSpeed's FusedLamb: 0, off)
APEX_EPS = 1e-6  # Apex FusedLAMB's default Adam epsilon (DeepSpeed's FusedLamb: 1e-8)
_NATIVE = (torch.float32, torch.float64)  # dtypes the arithmetic runs in directly; others are upcast to fp32


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in _NATIVE else torch.float32


def global_grad_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm over all tensors, accumulated in at least fp32, as a 0-d tensor on the first tensor's device.

    One foreach norm per (device, dtype) bucket and a stacked norm on top: no host sync.
    """
    buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        buckets.setdefault((g.device, g.dtype), []).append(g)
    acc = torch.float64 if any(dtype == torch.float64 for _, dtype in buckets) else torch.float32
    device = grads[0].device
    partial = [
        torch.linalg.vector_norm(torch.stack(torch._foreach_norm(ts, dtype=_work_dtype(dtype)))).to(device, acc)
        for (_, dtype), ts in buckets.items()
    ]
    return torch.linalg.vector_norm(torch.stack(partial))


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019) exactly as Apex FusedLAMB computes it, on any device; see the module docstring."""

    def __init__(
        self, params: Iterable[Any], lr: float = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
        eps: float = APEX_EPS, weight_decay: float = 0.01, bias_correction: bool = True, adam_w_mode: bool = True,
        grad_averaging: bool = True, max_grad_norm: float = APEX_MAX_GRAD_NORM, use_nvlamb: bool = False,
    ) -> None:
        checks = (
            ("lr", lr, lr >= 0, ">= 0"), ("eps", eps, eps >= 0, ">= 0"),
            ("weight_decay", weight_decay, weight_decay >= 0, ">= 0"),
            ("max_grad_norm", max_grad_norm, max_grad_norm >= 0, ">= 0 (0 disables the global-norm clipping)"),
            ("betas", betas, len(betas) == 2 and all(0 <= b < 1 for b in betas), "two values in [0, 1)"),
        )
        for name, value, ok, allowed in checks:
            if not ok:
                raise ValueError(f"Lamb: {name}={value!r} is not valid; allowed: {allowed}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, adam_w_mode=adam_w_mode, grad_averaging=grad_averaging,
                        max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb)
        super().__init__(params, defaults)

    def _clip_divisor(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        """``max(‖g‖ / max_grad_norm, 1)`` as a device tensor (Apex reads max_grad_norm from the defaults)."""
        max_norm = float(self.defaults["max_grad_norm"])
        if max_norm <= 0:
            return None
        return torch.clamp(global_grad_norm(grads) / max_norm, min=1.0)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with_grad = [[p for p in group["params"] if p.grad is not None] for group in self.param_groups]
        grads = [p.grad for params in with_grad for p in params]
        if any(g.is_sparse for g in grads):
            raise RuntimeError("Lamb does not support sparse gradients")
        divisor = self._clip_divisor(grads) if grads else None  # type: ignore[arg-type]
        for group, params in zip(self.param_groups, with_grad):
            group["step"] = group.get("step", 0) + 1  # every group, every call, as Apex does
            if params:
                self._update_group(group, params, divisor)
        return loss

    def _state_for(self, params: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        exp_avg, exp_avg_sq = [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avg.append(state["exp_avg"])
            exp_avg_sq.append(state["exp_avg_sq"])
        return exp_avg, exp_avg_sq

    def _update_group(self, group: dict[str, Any], params: list[torch.Tensor], divisor: torch.Tensor | None) -> None:
        beta1, beta2 = group["betas"]
        beta3 = 1.0 - beta1 if group["grad_averaging"] else 1.0
        decay, lr, step = group["weight_decay"], group["lr"], group["step"]
        bc1 = 1.0 - beta1**step if group["bias_correction"] else 1.0
        bc2 = 1.0 - beta2**step if group["bias_correction"] else 1.0
        exp_avg, exp_avg_sq = self._state_for(params)

        # Working copies in fp32 for fp16/bf16 tensors (Apex's MATH_T); fp32/fp64 tensors are used in place.
        def work(ts: list[torch.Tensor]) -> list[torch.Tensor]:
            return [t if t.dtype in _NATIVE else t.float() for t in ts]

        w_params, w_avg, w_avg_sq = work(params), work(exp_avg), work(exp_avg_sq)
        grads = [p.grad.to(_work_dtype(p.grad.dtype)) for p in params]  # type: ignore[union-attr]
        if divisor is not None:  # out of place: p.grad stays as it was
            grads = list(torch._foreach_div(grads, divisor.to(params[0].device)))
        if not group["adam_w_mode"] and decay != 0:  # L2 mode: decay joins the clipped gradient
            grads = list(torch._foreach_add(grads, w_params, alpha=decay))
        torch._foreach_mul_(w_avg, beta1)
        torch._foreach_add_(w_avg, grads, alpha=beta3)
        torch._foreach_mul_(w_avg_sq, beta2)
        torch._foreach_addcmul_(w_avg_sq, grads, grads, value=1.0 - beta2)
        denom = torch._foreach_div(w_avg_sq, bc2)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, group["eps"])
        updates = torch._foreach_div(w_avg, bc1)
        torch._foreach_div_(updates, denom)
        if group["adam_w_mode"] and decay != 0:  # AdamW mode: decoupled decay joins the update
            torch._foreach_add_(updates, w_params, alpha=decay)
        if group["use_nvlamb"] or decay != 0:
            p_norm = torch.stack(torch._foreach_norm(w_params))
            u_norm = torch.stack(torch._foreach_norm(updates))
            ratio = torch.where((p_norm > 0) & (u_norm > 0), p_norm / u_norm, torch.ones_like(p_norm))
            torch._foreach_mul_(updates, list((ratio * -lr).unbind()))
            torch._foreach_add_(w_params, updates)
        else:
            torch._foreach_add_(w_params, updates, alpha=-lr)
        for originals, working in ((params, w_params), (exp_avg, w_avg), (exp_avg_sq, w_avg_sq)):
            low = [(o, w) for o, w in zip(originals, working) if o is not w]
            if low:
                torch._foreach_copy_([o for o, _ in low], [w for _, w in low])
