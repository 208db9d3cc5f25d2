"""GPU check of the Triton pass that scales and rounds the CuTe backward's fp32 dQ sums (``kernels/common/dq_round``):
bit for bit torch's fp32 product rounded once, in bf16 (which the CPU interpreter computes wrongly) and fp16, across
programs' edges, with values that round, overflow and go subnormal; and the backward's dQ through it."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor.kernels.common.dq_round import BLOCK, scale_round_triton
from gdpa_inductor.kernels.cute.bwd_results import dq_of_sums

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("shape", [(1,), (3, 5, 77, 96), (1, 1, 3 * BLOCK + 5), (8, 4, 1000, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scale_round_is_torch_bit_for_bit(shape, dtype):
    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    sums = torch.randn(shape, device="cuda", generator=gen) * 10.0 ** torch.randint(
        -7, 7, shape, device="cuda", generator=gen)
    sums.view(-1)[-1] = float("-inf")
    want = torch.mul(sums, 0.0123, out=torch.empty(shape, dtype=dtype, device="cuda"))
    got = scale_round_triton(sums, torch.empty(shape, dtype=dtype, device="cuda"), 0.0123)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu"])
def test_dq_of_sums_takes_the_triton_pass(monkeypatch, activation):
    """On a GPU dQ's rounding runs the Triton pass (and gives torch's product), a strided buffer torch's. dQ's
    factor is the CuTe activation form's, so this needs the CuTe stack, as every caller of ``dq_of_sums`` does."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    calls = []
    real = scale_round_triton
    monkeypatch.setattr("gdpa_inductor.kernels.common.dq_round.scale_round_triton",
                        lambda *a: calls.append(1) or real(*a))
    sums = torch.randn(2, 4, 300, 128, device="cuda")
    got = dq_of_sums(sums, torch.bfloat16, activation, 0.125, 1 / 300)
    strided = dq_of_sums(sums.transpose(1, 2), torch.bfloat16, activation, 0.125, 1 / 300)
    assert calls == [1]
    assert torch.equal(got, strided.transpose(1, 2))
