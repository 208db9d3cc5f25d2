"""GPU correctness of the CuTe-DSL Hopper backward's causal mask (bottom-right aligned, Nk - Nq a multiple of 128;
skipped without an sm_90 GPU and nvidia-cutlass-dsl): through the op's autograd, dq, dk and dv against float64,
each within 2x eager's own error, over activations, ragged lengths (the last key tile is always a diagonal one),
Nk > Nq (key tiles wholly left of the diagonal), GQA, head dims, fp16 and bf16, one to sixteen key tiles (dQ
summed in place and in the fp32 buffer); both dQ sums forced; a non-finite key gives the reference's NaN/Inf
pattern wherever its key tile is computed."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.cute.bwd_plan import dq_sums_for
from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference_backward
from gdpa_inductor.lowering import dispatch

from .cute_common import (
    DTYPES,
    FLOOR,
    NEEDS_CUTE,
    assert_grads_within_eager,
    autograd_grads,
    bwd_inputs,
    dense_bwd_plan,
    rel_error,
)
from .test_cute_causal_fwd_cuda import eager_causal

pytestmark = NEEDS_CUTE

# (dtype, activation, Z, H, Hkv, Nq, Nk, D, Dv)
CAUSAL_BWD_CASES = [
    ("bf16", "gelu_tanh", 2, 4, 4, 300, 300, 128, 128),
    ("fp16", "silu", 2, 4, 2, 257, 385, 128, 128),
    ("bf16", "relu", 8, 4, 4, 512, 512, 64, 64),
    ("bf16", "sigmoid", 1, 2, 2, 17, 145, 128, 128),
    ("bf16", "gelu", 3, 4, 4, 1000, 1128, 96, 128),
    ("bf16", "silu", 1, 8, 2, 2048, 2048, 128, 128),
    ("fp16", "gelu_tanh", 20, 4, 4, 200, 200, 128, 64),
    ("bf16", "relu_square", 2, 4, 4, 128, 128, 128, 128),
    ("bf16", "gelu_tanh", 2, 4, 4, 64, 64, 128, 128),
    ("bf16", "leaky_relu", 1, 4, 4, 1100, 1356, 128, 128),
    ("fp16", "hardswish", 2, 4, 2, 700, 956, 64, 96),
]


def _eager_causal_grads(q, k, v, do, activation, scale, post_scale):
    return autograd_grads(eager_causal, q, k, v, do, activation, scale, post_scale)


@pytest.mark.parametrize("case", CAUSAL_BWD_CASES, ids=lambda c: "-".join(map(str, c)))
def test_causal_backward_matches_float64(case, cute_backend):
    dtype_name, act, z, h, hkv, nq, nk, d, dv = case
    dtype = DTYPES[dtype_name]
    q, k, v, do = bwd_inputs(z, h, hkv, nq, nk, d, dv, dtype, 2)
    scale, post = d**-0.5, 1.0 / nk
    assert dispatch.select_backward_impl(q, k, v, None, True, act) == "cute"
    refs = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, act, scale, post,
                                   causal=True)[:3]
    grads = autograd_grads(lambda *qkv: gdpa(*qkv, activation=act, scale=scale, post_scale=post, causal=True),
                           q, k, v, do)
    assert_grads_within_eager(grads, refs, _eager_causal_grads(q, k, v, do, act, scale, post), dtype)


@pytest.mark.parametrize("nq, nk", [(1000, 1000), (300, 1324)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_causal_dq_sums_each_within_eager_error(nq, nk, dtype):
    """dQ summed in place and in the fp32 buffer, forced, each within 2x eager's error; dK and dV the same bits
    either way (the sums touch only dQ)."""
    q, k, v, do = bwd_inputs(2, 4, 4, nq, nk, 128, 128, dtype, 5)
    scale, post = 128**-0.5, 1.0 / nk
    refs = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, "silu", scale, post,
                                   causal=True)[:3]
    base = rel_error(_eager_causal_grads(q, k, v, do, "silu", scale, post)[0], refs[0])
    assert dq_sums_for(nk) in ("in_place", "fp32")
    grads = {how: gdpa_bwd_cute(q, k, v, do, "silu", scale, post, 0.01, causal=True,
                                plan=dense_bwd_plan(q, k, v, "silu", causal=True, dq_sums=how))
             for how in ("in_place", "fp32")}
    for how, (dq, *_) in grads.items():
        assert rel_error(dq, refs[0]) <= 2 * base + FLOOR, (how, rel_error(dq, refs[0]), base)
    assert all(torch.equal(a, b) for a, b in zip(grads["in_place"][1:3], grads["fp32"][1:3]))


@pytest.mark.parametrize("act", ["relu", "sigmoid"])
def test_causal_backward_nonfinite_key_as_reference(act, cute_backend):
    """An infinite key (key 200 of 300, in the second 128-key tile) gives the reference's NaN/Inf pattern in dk,
    dv and in dq of every query tile its key tile visits (from row 128: masked scores there give dS = 0, and
    0 times the key is NaN, as in the reference's matmul). The query tiles before the key tile's diagonal skip
    it, as flash attention's do, so their dq stays finite where the reference's dense matmul multiplies their
    masked zeros by the key."""
    q, k, v, do = bwd_inputs(1, 2, 2, 300, 300, 128, 128, torch.bfloat16, 3)
    k[0, 0, 200, 5] = float("inf")
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    gdpa(qa, ka, va, activation=act, causal=True).backward(do)
    expected = gdpa_reference_backward(do, q, k, v, None, act, 1.0, 1.0, causal=True)[:3]
    visited = (qa.grad[..., 128:, :], expected[0][..., 128:, :])
    for got, want in ((ka.grad, expected[1]), (va.grad, expected[2]), visited):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    assert not torch.isfinite(expected[0][0, 0, 128:]).all()
    assert torch.isfinite(qa.grad[0, :, :128]).all() and torch.isfinite(qa.grad[0, 1]).all()
