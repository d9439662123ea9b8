"""Statistics stay FP32 whatever autocast a user's training loop runs the hooks under, and the CPU's upper-triangle
products are the full product.

Found on an H100 (benchmarks.gpu, part diagnose): the forward hooks run inside ``torch.autocast(fp16)``, so the
Gram matrix of an FP32 input (a LayerNorm output) was computed as an FP16 matmul and overflowed to inf at 16384
tokens of BERT-Large, and every exact FP16 factor window was dropped. The CPU's autocast shows the same.
"""

from __future__ import annotations

import pytest
import torch

from kaisa_ds.factors.statistics import gram, linear_input_sum, output_grad_sum, triangle_blocks


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_statistics_under_autocast_are_exact_fp32(dtype: torch.dtype) -> None:
    rows = torch.full((20000, 4), 2.0)  # Σ x² = 80000: past FP16's 65504, and not a BF16 number
    with torch.autocast("cpu", dtype=dtype):
        a, n = linear_input_sum(rows, has_bias=True)
        g, _ = output_grad_sum(rows)
    assert a.dtype == g.dtype == torch.float32 and n == 20000
    assert a[:4, :4].unique().tolist() == [80000.0] and a[:4, 4].unique().tolist() == [40000.0]
    assert g.unique().tolist() == [80000.0]


@pytest.mark.parametrize("blocks", [2, 3, 4, 7])
@pytest.mark.parametrize("features", [5, 257])  # block edges that do not divide the features
def test_the_upper_triangle_blocks_give_the_full_product(blocks: int, features: int) -> None:
    x = torch.randn(300, features, generator=torch.Generator().manual_seed(features), dtype=torch.float64)
    exact = x.t() @ x
    got = gram(x.float(), blocks=blocks)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-4)
    upper = torch.triu(got, 1)
    assert torch.equal(upper, torch.tril(got, -1).t())  # the lower blocks are the upper ones' transposes


def test_a_bias_factor_takes_the_blocked_product_in_place() -> None:
    """The A factor of a Linear with bias: [x, 1]ᵀ[x, 1], the blocked product written into its corner, the border the
    column sums; 512 features take 2 blocks by default."""
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1))
    assert triangle_blocks(512, x.device) == 2
    a, n = linear_input_sum(x, has_bias=True)
    ones = torch.cat([x, torch.ones(64, 1)], 1).double()
    torch.testing.assert_close(a.double(), ones.t() @ ones, rtol=1e-5, atol=1e-3)
    assert n == 64


def test_the_split_follows_the_measured_sizes() -> None:
    """Below 256 features one product (the split did not pay there), 2 blocks up to 1,023, 4 from 1,024; CUDA keeps
    its single tensor-core GEMM."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [triangle_blocks(f, cpu) for f in (128, 255, 256, 1023, 1024, 4096)] == [1, 1, 2, 2, 4, 4]
    assert triangle_blocks(4096, cuda) == 1
