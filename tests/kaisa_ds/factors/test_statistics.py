"""Statistics stay FP32 whatever autocast a user's training loop runs the hooks under.

Found on an H100 (benchmarks.gpu, part diagnose): the forward hooks run inside ``torch.autocast(fp16)``, so the
Gram matrix of an FP32 input (a LayerNorm output) was computed as an FP16 matmul and overflowed to inf at 16384
tokens of BERT-Large, and every exact FP16 factor window was dropped. The CPU's autocast shows the same.
"""

from __future__ import annotations

import pytest
import torch

from kaisa_ds.factors.statistics import linear_input_sum, output_grad_sum


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_statistics_under_autocast_are_exact_fp32(dtype: torch.dtype) -> None:
    rows = torch.full((20000, 4), 2.0)  # Σ x² = 80000: past FP16's 65504, and not a BF16 number
    with torch.autocast("cpu", dtype=dtype):
        a, n = linear_input_sum(rows, has_bias=True)
        g, _ = output_grad_sum(rows)
    assert a.dtype == g.dtype == torch.float32 and n == 20000
    assert a[:4, :4].unique().tolist() == [80000.0] and a[:4, 4].unique().tolist() == [40000.0]
    assert g.unique().tolist() == [80000.0]
