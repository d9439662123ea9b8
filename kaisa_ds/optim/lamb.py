"""Pure-PyTorch LAMB with the semantics of NVIDIA Apex ``FusedLAMB``.

Follows apex/optimizers/fused_lamb.py and csrc/multi_tensor_lamb.cu (stage 1 and stage 2 functors):
1. the global L2 norm of all gradients pre-normalises them: ``g / max(‖g‖ / max_grad_norm, 1)``;
2. Adam moments with ``beta3 = 1 - beta1`` (grad averaging) and optional bias correction;
3. AdamW mode adds ``weight_decay · p`` to the update (L2 mode adds it to the gradient instead);
4. per-tensor trust ratio ``‖p‖ / ‖update‖`` (1 when either is 0), applied only where weight decay is non-zero
   unless ``use_nvlamb``; ``p ← p − lr · ratio · update``.
Norms are computed with foreach kernels and stay on the device: no host sync per parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019) as implemented by Apex FusedLAMB, for any device."""

    def __init__(
        self, params: Iterable[Any], lr: float = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True, adam_w_mode: bool = True,
        grad_averaging: bool = True, max_grad_norm: float = 1.0, use_nvlamb: bool = False,
    ) -> None:
        for name, value, ok in (("lr", lr, lr >= 0), ("eps", eps, eps >= 0), ("weight_decay", weight_decay,
                                weight_decay >= 0), ("max_grad_norm", max_grad_norm, max_grad_norm >= 0),
                                ("betas", betas, all(0 <= b < 1 for b in betas))):
            if not ok:
                raise ValueError(f"Lamb: invalid {name}={value!r}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                        adam_w_mode=adam_w_mode, grad_averaging=grad_averaging, use_nvlamb=use_nvlamb)
        super().__init__(params, defaults)
        self.max_grad_norm = max_grad_norm

    def _global_clip(self, grads: list[torch.Tensor]) -> torch.Tensor:
        norms = torch._foreach_norm(grads)
        wide = [n.to(torch.promote_types(n.dtype, torch.float32)) for n in norms]
        total = torch.linalg.vector_norm(torch.stack(wide))
        if self.max_grad_norm <= 0:
            return torch.ones_like(total)
        return torch.clamp(total / self.max_grad_norm, min=1.0)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        all_grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not all_grads:
            return loss
        if any(g.is_sparse for g in all_grads):
            raise RuntimeError("Lamb does not support sparse gradients")
        clip = self._global_clip(all_grads)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update_group(group, params, clip)
        return loss

    def _update_group(self, group: dict[str, Any], params: list[torch.Tensor], clip: torch.Tensor) -> None:
        beta1, beta2 = group["betas"]
        beta3 = 1.0 - beta1 if group["grad_averaging"] else 1.0
        decay = group["weight_decay"]
        group["step"] = group.get("step", 0) + 1
        step = group["step"]
        bc1 = 1.0 - beta1**step if group["bias_correction"] else 1.0
        bc2 = 1.0 - beta2**step if group["bias_correction"] else 1.0
        exp_avg, exp_avg_sq = [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avg.append(state["exp_avg"])
            exp_avg_sq.append(state["exp_avg_sq"])
        grads = torch._foreach_div([p.grad for p in params], clip)  # type: ignore[misc]
        if not group["adam_w_mode"] and decay != 0:
            torch._foreach_add_(grads, params, alpha=decay)
        torch._foreach_mul_(exp_avg, beta1)
        torch._foreach_add_(exp_avg, grads, alpha=beta3)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1.0 - beta2)
        denom = torch._foreach_div(exp_avg_sq, bc2)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, group["eps"])
        updates = torch._foreach_div(exp_avg, bc1)
        torch._foreach_div_(updates, denom)
        if group["adam_w_mode"] and decay != 0:
            torch._foreach_add_(updates, params, alpha=decay)
        if group["use_nvlamb"] or decay != 0:
            p_norms = torch._foreach_norm(params)
            u_norms = torch._foreach_norm(updates)
            ratios = [torch.where((pn > 0) & (un > 0), pn / un, torch.ones_like(pn))
                      for pn, un in zip(p_norms, u_norms)]
            torch._foreach_mul_(updates, ratios)  # type: ignore[arg-type]
        torch._foreach_add_(params, updates, alpha=-group["lr"])
