"""Per-module-type K-FAC math: which statistics a module yields and how its gradient is a matrix.

The gradient matrix is ``(out, in)`` with the bias as an extra input column: ``[∇W | ∇b]``.
For ``nn.Embedding`` the input is a one-hot over the vocabulary, so ``in`` is the vocabulary,
``out`` is the embedding width, and the matrix is ``∇Wᵀ``.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from kaisa_ds.factors import statistics as st


class GradAccessor(Protocol):
    """Where a parameter's full, rank-averaged (possibly loss-scaled) gradient is read and written. An accessor may
    also have ``target(param)``: the tensor, shaped as ``param``, that ``set`` would copy into (None: call ``set``),
    which lets a step write every gradient in one batched copy."""

    def get(self, param: nn.Parameter) -> torch.Tensor | None: ...

    def set(self, param: nn.Parameter, grad: torch.Tensor) -> None: ...


class ParamGradAccessor:
    """The default accessor: ``param.grad``."""

    def get(self, param: nn.Parameter) -> torch.Tensor | None:
        return param.grad

    def target(self, param: nn.Parameter) -> torch.Tensor | None:
        return param.grad

    def set(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        if param.grad is None:
            param.grad = grad.to(param.dtype)
        else:
            param.grad.copy_(grad)


class GradWatermark:
    """Remembers the gradient tensors a step wrote, to notice a second step without a new backward pass.

    Only for gradients held in ``param.grad`` (the default accessor): the same tensor object at the same
    version counter means nothing has touched it since K-FAC wrote it. Engines guard this themselves.
    """

    def __init__(self) -> None:
        self._seen: list[tuple[weakref.ref[torch.Tensor], int]] = []

    def record(self, accessor: GradAccessor, params: list[torch.nn.Parameter]) -> None:
        if not isinstance(accessor, ParamGradAccessor):
            return
        grads = [p.grad for p in params]
        self._seen = [(weakref.ref(g), g._version) for g in grads if g is not None]

    def unchanged(self, accessor: GradAccessor, params: list[torch.nn.Parameter]) -> bool:
        if not self._seen or not isinstance(accessor, ParamGradAccessor):
            return False
        grads = [p.grad for p in params if p.grad is not None]
        return len(grads) == len(self._seen) and all(
            ref() is g and g._version == version for (ref, version), g in zip(self._seen, grads))


class ModuleHelper:
    """Statistics and gradient-matrix views of one supported module.

    A factor larger than ``max_factor_dim`` (an LM head's vocabulary-sized G: 32,000² floats are 4 GB, and their
    eigendecomposition minutes) keeps only its diagonal, as an embedding's one-hot A always does. So does a dense
    factor more than ``max_factor_ratio`` times its layer's other side (one-sided preconditioning, as SOAP offers:
    a transformer MLP's wide side is most of a step's rotations, statistics and decompositions)."""

    one_hot_input = False  # the input is token ids: A is diagonal whatever its size
    lookup_ids = False  # the ids are those its F.embedding call looks up, not its first input (kaisa_ds.layers.lookup)
    g_channels_dim = -1

    def __init__(self, module: nn.Module, *, max_factor_dim: int | None = None,
                 max_factor_ratio: float | None = None) -> None:
        self.module = module
        limit = max_factor_dim if max_factor_dim is not None else float("inf")
        ratio = max_factor_ratio if max_factor_ratio is not None and not self.one_hot_input else float("inf")
        self.diagonal_a = self.one_hot_input or self.a_dim > limit or self.a_dim > ratio * self.g_dim
        self.diagonal_g = self.g_dim > limit or self.g_dim > ratio * self.a_dim

    @property
    def weight(self) -> nn.Parameter:
        return self.module.weight  # type: ignore[return-value]

    @property
    def bias(self) -> nn.Parameter | None:
        return getattr(self.module, "bias", None)

    @property
    def a_dim(self) -> int:
        raise NotImplementedError

    @property
    def g_dim(self) -> int:
        return int(self.weight.shape[0])

    def a_statistic(self, inp: torch.Tensor, select: st.Rows = st.keep_all) -> tuple[torch.Tensor, int]:
        """``(Σ a aᵀ, samples)`` of one pass; ``select`` picks the rows (samples) to use."""
        raise NotImplementedError

    def g_statistic(self, grad_out: torch.Tensor, select: st.Rows = st.keep_all) -> tuple[torch.Tensor, int]:
        return st.output_grad_sum(grad_out, channels_dim=self.g_channels_dim, select=select, diagonal=self.diagonal_g)

    def weight_matrix(self, grad: torch.Tensor) -> torch.Tensor:
        """The weight's gradient as the (out, in) matrix of the layer's math (flattened: a convolution's)."""
        return grad.reshape(grad.shape[0], -1)

    def weight_from_matrix(self, mat: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`weight_matrix`, up to the weight's own shape (a view where it can be)."""
        return mat

    def grad_matrix(self, accessor: GradAccessor) -> torch.Tensor | None:
        """``[∇W | ∇b]`` as (out, in) in FP32, or None when the weight has no gradient."""
        gw = accessor.get(self.weight)
        if gw is None:
            return None
        mat = self.weight_matrix(gw).float()
        bias = self.bias
        if bias is not None:
            gb = accessor.get(bias)
            gb = torch.zeros(mat.shape[0], device=mat.device) if gb is None else gb.float()
            mat = torch.cat([mat, gb.reshape(-1, 1)], dim=1)
        return mat

    def grad_parts(self, mat: torch.Tensor) -> list[tuple[nn.Parameter, torch.Tensor]]:
        """A (out, in) matrix as the weight's (and bias's) gradients: views of it, the weight's flattened to 2-D."""
        bias = self.bias
        if bias is None:
            return [(self.weight, self.weight_from_matrix(mat))]
        return [(self.weight, self.weight_from_matrix(mat[:, :-1])), (bias, mat[:, -1])]


class LinearHelper(ModuleHelper):
    @property
    def a_dim(self) -> int:
        return int(self.weight.shape[1]) + (1 if self.bias is not None else 0)

    def a_statistic(self, inp: torch.Tensor, select: st.Rows = st.keep_all) -> tuple[torch.Tensor, int]:
        return st.linear_input_sum(inp, has_bias=self.bias is not None, select=select, diagonal=self.diagonal_a)


class Conv2dHelper(ModuleHelper):
    g_channels_dim = 1

    @property
    def a_dim(self) -> int:
        w = self.weight
        return int(w.shape[1] * w.shape[2] * w.shape[3]) + (1 if self.bias is not None else 0)

    def a_statistic(self, inp: torch.Tensor, select: st.Rows = st.keep_all) -> tuple[torch.Tensor, int]:
        return st.conv2d_input_sum(inp, self.module, select=select, diagonal=self.diagonal_a)  # type: ignore[arg-type]


class EmbeddingHelper(ModuleHelper):
    one_hot_input = True

    @property
    def a_dim(self) -> int:
        return int(self.weight.shape[0])

    @property
    def g_dim(self) -> int:
        return int(self.weight.shape[1])

    @property
    def bias(self) -> nn.Parameter | None:
        return None

    def a_statistic(self, inp: torch.Tensor, select: st.Rows = st.keep_all) -> tuple[torch.Tensor, int]:
        return st.embedding_input_sum(inp, self.a_dim)  # token counts: cheap, always from every token

    def weight_matrix(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.t()  # the table is (vocab, width): the math's matrix is (width, vocab)

    def weight_from_matrix(self, mat: torch.Tensor) -> torch.Tensor:
        return mat.t()


class Conv1DHelper(LinearHelper):
    """transformers' ``Conv1D`` (GPT-2's c_attn, c_proj, c_fc; GPT-2-style models): a Linear layer whose weight is
    stored transposed, ``(in, out)``, and always has a bias."""

    @property
    def a_dim(self) -> int:
        return int(self.weight.shape[0]) + (1 if self.bias is not None else 0)

    @property
    def g_dim(self) -> int:
        return int(self.weight.shape[1])

    def weight_matrix(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.t()

    def weight_from_matrix(self, mat: torch.Tensor) -> torch.Tensor:
        return mat.t()


class ScaledEmbeddingHelper(EmbeddingHelper):
    """An embedding that multiplies its output by ``embed_scale`` (transformers' ``*ScaledWordEmbedding``: BART,
    Gemma): the gradient reaching the table is the output's times the scale, so G is scaled by its square."""

    def g_statistic(self, grad_out: torch.Tensor, select: st.Rows = st.keep_all) -> tuple[torch.Tensor, int]:
        stat, count = super().g_statistic(grad_out, select)
        scale: torch.Tensor | float = getattr(self.module, "embed_scale")  # noqa: B009  (a tensor, a number)
        return stat.mul_(scale * scale if isinstance(scale, torch.Tensor) else float(scale) ** 2), count


class LookupEmbeddingHelper(EmbeddingHelper):
    """An embedding that computes the ids it looks up (OPT's and BART's learned position tables): A counts the ids of
    its ``F.embedding`` call, which the capture records (:mod:`kaisa_ds.layers.lookup`)."""

    lookup_ids = True


def _hf_conv1d() -> type[nn.Module] | None:
    """transformers' ``Conv1D`` class when transformers is loaded (a model built from it has loaded it), else None:
    kaisa_ds does not import transformers for models that do not use it."""
    module = sys.modules.get("transformers.pytorch_utils")
    return getattr(module, "Conv1D", None)


HELPERS: dict[type[nn.Module], Callable[..., ModuleHelper]] = {
    nn.Linear: LinearHelper,
    nn.Conv2d: Conv2dHelper,
    nn.Embedding: EmbeddingHelper,
}


def write_grads(accessor: GradAccessor, parts: list[tuple[nn.Parameter, torch.Tensor]]) -> None:
    """Write many parameters' gradients (in their own dtypes): one batched copy into every tensor the accessor
    exposes, instead of a reshape, a cast and a copy per parameter; ``set`` for the rest, in order (under ZeRO-1/2
    each is a collective)."""
    target = getattr(accessor, "target", lambda param: None)  # optional: accessors with only get/set still work
    dsts, srcs, rest = [], [], []
    for param, src in parts:
        dst = target(param)
        if dst is not None and dst.is_contiguous():
            dsts.append(dst.view(src.shape))
            srcs.append(src)
        else:
            rest.append((param, src))
    if dsts:
        torch._foreach_copy_(dsts, srcs)
    for param, src in rest:
        accessor.set(param, src.reshape(param.shape).to(param.dtype))


def _overrides_forward(module: nn.Module, base: type[nn.Module]) -> bool:
    return type(module).forward is not base.forward  # type: ignore[comparison-overlap]


def why_unsupported(module: nn.Module) -> str | None:
    """Why a module of a supported kind is not preconditioned (None: it is supported, or not of such a kind)."""
    if isinstance(module, nn.Conv2d) and module.groups != 1:
        return f"grouped convolution (groups={module.groups})"
    if isinstance(module, nn.Embedding) and module.sparse:
        return "sparse gradients"
    return None


def helper_for(module: nn.Module, *, max_factor_dim: int | None = None,
               max_factor_ratio: float | None = None) -> ModuleHelper | None:
    """The helper for a supported module type (exact type or subclass), else None (:func:`why_unsupported`)."""
    if why_unsupported(module) is not None:
        return None
    conv1d = _hf_conv1d()
    if conv1d is not None and isinstance(module, conv1d):
        return Conv1DHelper(module, max_factor_dim=max_factor_dim, max_factor_ratio=max_factor_ratio)
    if isinstance(module, nn.Embedding) and _overrides_forward(module, nn.Embedding):
        # a scaled word embedding looks up its input (times a scale); anything else computes the ids itself
        helper = ScaledEmbeddingHelper if hasattr(module, "embed_scale") else LookupEmbeddingHelper
        return helper(module, max_factor_dim=max_factor_dim, max_factor_ratio=max_factor_ratio)
    for cls, make in HELPERS.items():
        if isinstance(module, cls):
            return make(module, max_factor_dim=max_factor_dim, max_factor_ratio=max_factor_ratio)
    return None
