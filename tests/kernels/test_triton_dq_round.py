"""The Triton pass that scales and rounds the CuTe backward's fp32 dQ sums, run by the Triton interpreter on CPU
tensors against torch's product of the same sums (fp16 and fp32 outputs: the interpreter computes bf16 wrongly),
and its argument checks."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import requires_interpreter

from gdpa_inductor.kernels.common.dq_round import BLOCK, scale_round_triton


@requires_interpreter
@pytest.mark.parametrize("shape", [(1,), (2, 3, 5, 64), (1, 1, BLOCK + 1, 1), (2, 2, 130, 96)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_scale_round_matches_torch(shape, dtype):
    """Bit for bit torch.mul(sums, factor, out=) (an fp32 product rounded once), across programs' edges; values
    large and small enough that fp16 rounds, overflows to inf and flushes to subnormals."""
    gen = torch.Generator().manual_seed(sum(shape))
    sums = torch.randn(shape, generator=gen) * torch.logspace(-6, 6, sum(shape) % 7 + 5)[
        torch.randint(0, sum(shape) % 7 + 5, shape, generator=gen)]
    sums.view(-1)[0] = float("nan")
    out = torch.full(shape, 7.0, dtype=dtype)
    got = scale_round_triton(sums, out, 0.0123)
    want = torch.mul(sums, 0.0123, out=torch.empty(shape, dtype=dtype))
    assert got is out
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("sums, out, match", [
    (torch.zeros(4, 8).t(), torch.empty(8, 4, dtype=torch.half), "contiguous fp32"),
    (torch.zeros(8, 4, dtype=torch.half), torch.empty(8, 4, dtype=torch.half), "contiguous fp32"),
    (torch.zeros(8, 4), torch.empty(4, 8, dtype=torch.half).t(), "out contiguous"),
    (torch.zeros(8, 4), torch.empty(8, 5, dtype=torch.half), r"the sums' shape \(8, 4\)"),
])
def test_scale_round_names_what_it_needs(sums, out, match):
    with pytest.raises(ValueError, match=match):
        scale_round_triton(sums, out, 1.0)


def test_scale_round_of_nothing_launches_nothing():
    out = torch.empty(0, 128, dtype=torch.half)
    assert scale_round_triton(torch.empty(0, 128), out, 2.0) is out
