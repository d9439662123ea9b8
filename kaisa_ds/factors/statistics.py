"""Second-moment statistics of layer inputs (A) and output gradients (G), as (sum, sample count).

Every leading position of a tensor is a sample (a token of a transformer, a pixel of a conv map),
so each function flattens to ``(samples, features)`` and returns ``Xᵀ X`` in FP32 with the count.
Returning sums rather than means lets micro-batches of different sizes accumulate exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Rows = Callable[[torch.Tensor], torch.Tensor]  # picks the rows to use (a sampler), or keeps them all


def keep_all(x: torch.Tensor) -> torch.Tensor:
    """Every row (full statistics)."""
    return x


def triangle_blocks(features: int, device: torch.device) -> int:
    """How many column blocks :func:`gram` splits a CPU product into, computing only the blocks on and above the
    diagonal. ``python -m benchmarks.gram_blocks`` (2 cores, 2,048 and 8,192 rows; benchmarks/results/gram_blocks.json)
    found 2 blocks 0.76-0.88x a full product's time from 256 features up (not below), 4 blocks 0.65-0.75x from 1,024.
    On CUDA one tensor-core GEMM: the split is unmeasured there."""
    if device.type == "cuda" or features < 256:
        return 1
    return 4 if features >= 1024 else 2


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in FP32: half-precision (CUDA) operands accumulate and return FP32."""
    if a.dtype in (torch.float16, torch.bfloat16):
        return torch.mm(a, b, out_dtype=torch.float32)
    return a @ b


def gram(x: torch.Tensor, *, blocks: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``xᵀ x`` in FP32. On CUDA the inputs are BF16 (FP16 ones stay FP16) in tensor-core GEMMs
    with FP32 accumulation and output: an FP32 input (a LayerNorm's output under BF16 autocast, an FP32 run) is
    rounded to BF16 first, as the step's physical cost asks (FP32 GEMMs miss the tensor cores), and an FP16 result
    cannot overflow. With ``blocks`` > 1 (default :func:`triangle_blocks`) the product is computed in column blocks,
    the upper ones only, their transposes filling the rest. Autocast is off here: the hooks run inside the user's
    ``torch.autocast``, which would make an FP32 input's product FP16 (inf past 65504).
    ``out``: an FP32 (features, features) view to write into."""
    d = x.shape[1]
    k = triangle_blocks(d, x.device) if blocks is None else blocks
    with torch.autocast(x.device.type, enabled=False):
        if x.is_cuda and x.dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = x.to(torch.bfloat16) if x.dtype == torch.float32 else x
        else:
            x = x.to(torch.float32)
        if k <= 1:
            full = _product(x.t(), x)
            return full if out is None else out.copy_(full)
        target = torch.empty(d, d, dtype=torch.float32, device=x.device) if out is None else out
        edges = [round(i * d / k) for i in range(k + 1)]
        for i in range(k):
            rows = slice(edges[i], edges[i + 1])
            xi = x[:, rows]
            target[rows, rows] = _product(xi.t(), xi)
            for j in range(i + 1, k):
                cols = slice(edges[j], edges[j + 1])
                block = _product(xi.t(), x[:, cols])
                target[rows, cols] = block
                target[cols, rows] = block.t()
        return target


def diagonal_sum(x: torch.Tensor) -> torch.Tensor:
    """``diag(xᵀ x)``, the column sums of squares, in FP32 (a factor too large to hold whole keeps its diagonal)."""
    with torch.autocast(x.device.type, enabled=False):
        return x.float().square().sum(0)


def second_moment_sum(rows: torch.Tensor, *, append_ones: bool = False, select: Rows = keep_all,
                      diagonal: bool = False) -> tuple[torch.Tensor, int]:
    """``Σ x xᵀ`` over the (selected) rows of a (samples, features) matrix, in FP32, and the row count.

    With ``append_ones`` the result is that of ``[x, 1]`` without materialising the extra column:
    the border is the column sums and the corner the sample count. With ``diagonal`` only its diagonal, a vector.
    """
    x = select(rows.detach())
    n, d = x.shape
    if diagonal:
        diag = diagonal_sum(x)
        return (torch.cat([diag, diag.new_full((1,), float(n))]) if append_ones else diag), n
    if not append_ones:
        return gram(x), n
    out = torch.empty(d + 1, d + 1, dtype=torch.float32, device=x.device)
    gram(x, out=out[:d, :d])
    col = x.sum(0, dtype=torch.float32)
    out[:d, d] = col
    out[d, :d] = col
    out[d, d] = n
    return out, n


def linear_input_sum(x: torch.Tensor, *, has_bias: bool, select: Rows = keep_all,
                     diagonal: bool = False) -> tuple[torch.Tensor, int]:
    """A-statistic of an ``nn.Linear`` input of any rank; the bias adds a column of ones."""
    return second_moment_sum(x.reshape(-1, x.shape[-1]), append_ones=has_bias, select=select, diagonal=diagonal)


def conv2d_input_sum(x: torch.Tensor, conv: nn.Conv2d, *, select: Rows = keep_all,
                     diagonal: bool = False) -> tuple[torch.Tensor, int]:
    """A-statistic of an ``nn.Conv2d`` input from its extracted patches (one sample per output position)."""
    if isinstance(conv.padding, str):
        raise ValueError(f"Conv2d padding={conv.padding!r} is not supported by K-FAC; use numeric padding")
    patches = F.unfold(x.detach(), conv.kernel_size, dilation=conv.dilation, padding=conv.padding,
                       stride=conv.stride)  # (B, C*kh*kw, L)
    rows = patches.transpose(1, 2).reshape(-1, patches.shape[1])
    return second_moment_sum(rows, append_ones=conv.bias is not None, select=select, diagonal=diagonal)


def embedding_input_sum(ids: torch.Tensor, num_embeddings: int) -> tuple[torch.Tensor, int]:
    """Diagonal A-statistic of an ``nn.Embedding``: one-hot inputs make ``Σ a aᵀ`` the token counts."""
    flat = ids.detach().reshape(-1)
    counts = torch.bincount(flat, minlength=num_embeddings).to(torch.float32)
    return counts, flat.numel()


def output_grad_sum(grad: torch.Tensor, *, channels_dim: int = -1, select: Rows = keep_all,
                    diagonal: bool = False) -> tuple[torch.Tensor, int]:
    """G-statistic of an output gradient; conv maps put channels on dim 1."""
    g = grad.movedim(channels_dim, -1) if channels_dim != -1 else grad
    return second_moment_sum(g.reshape(-1, g.shape[-1]), select=select, diagonal=diagonal)
