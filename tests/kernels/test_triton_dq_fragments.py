"""The Triton pass that turns the 80-row CuTe backward's fp32 dQ sums (in its accumulators' order) into dQ, run by
the Triton interpreter on CPU tensors against the torch permute of the same sums (fp16 and fp32 outputs: the
interpreter computes bf16 wrongly)."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import requires_interpreter, wgmma_fragments_of

from gdpa_inductor.kernels.common.dq_fragments import dq_of_fragments_triton
from gdpa_inductor.kernels.cute.bwd_plan import LONG_QUERY_TILE
from gdpa_inductor.kernels.cute.bwd_results import dq_fragments_as_rows

pytestmark = requires_interpreter


@pytest.mark.parametrize("num_queries", [1, 80, 170])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dq_of_fragments_matches_the_torch_permute(num_queries, dtype):
    rows = -(-num_queries // LONG_QUERY_TILE) * LONG_QUERY_TILE
    dq = torch.randn(2, 2, rows, 128, generator=torch.Generator().manual_seed(num_queries))
    sums = wgmma_fragments_of(dq, LONG_QUERY_TILE)
    out = torch.full((2, 2, num_queries, 128), float("nan"), dtype=dtype)
    dq_of_fragments_triton(sums, out, 0.375, LONG_QUERY_TILE)
    assert torch.equal(out, (dq_fragments_as_rows(sums)[:, :, :num_queries] * 0.375).to(dtype))


def test_dq_of_fragments_writes_through_the_output_strides():
    """dQ may be a view with rows of its own stride (a [Z, Nq, H, D] tensor seen as [Z, H, Nq, D])."""
    dq = torch.randn(1, 3, 80, 128, generator=torch.Generator().manual_seed(3))
    base = torch.full((1, 80, 3, 128), float("nan"), dtype=torch.float16)
    out = base.transpose(1, 2)
    dq_of_fragments_triton(wgmma_fragments_of(dq, LONG_QUERY_TILE), out, 2.0, LONG_QUERY_TILE)
    assert torch.equal(out, (dq * 2.0).half())
