"""GPU correctness of the CuTe-DSL Hopper backward (skipped without an sm_90 GPU and nvidia-cutlass-dsl;
on the lent H200 cutlass-dsl is staged with ../shared/device/stage-cute-dsl.sh).

Through the op's autograd with ``config.backend = "cute"`` (forward and backward both CuTe): dq, dk and dv
against a float64 reference, each within 2x of eager PyTorch's own error in the same dtype at the same
inputs, over every activation, ragged lengths (TMA zero fill plus the masks on the last key and query
tiles), GQA (per-head dK/dV summed over each group), D in {64, 128}, fp16 and bf16; plus the dispatch of
"auto" (the CuTe backward where it covers the call) and non-finite inputs.
"""

from __future__ import annotations

import pytest
import torch

import gdpa_inductor
from gdpa_inductor.kernels.cute.bwd_plan import DQ_DIRECT_MAX_KEY_TILES, LONG_QUERY_TILE, bwd_query_tile, dq_sums_for
from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference_backward
from gdpa_inductor.lowering.dispatch import select_backward_impl, select_forward_impl

from .cute_common import CASES as SHARED_CASES
from .cute_common import (
    FLOOR,
    NEEDS_CUTE,
    assert_backward_case_within_eager,
    assert_nonfinite_like_eager,
    dense_bwd_plan,
    eager_grads,
    rel_error,
)

pytestmark = NEEDS_CUTE
# the forward's cases plus a ragged fp16 D=64 one, Meta's 2048x256, key ranges past the in-place dQ sums (12 and 16
# key tiles; GQA, fp16) and one that the fp32 buffer sums at D=64 (16 tiles)
CASES = SHARED_CASES + [
    ("fp16", "silu", 1, 4, 4, 1000, 200, 64, 64), ("bf16", "gelu_tanh", 2, 4, 4, 2048, 256, 128, 128),
    ("bf16", "silu", 1, 4, 4, 300, 1500, 128, 128), ("fp16", "gelu_tanh", 1, 4, 2, 129, 2045, 128, 128),
    ("fp16", "gelu_tanh", 1, 4, 2, 129, 2045, 64, 64),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_cute_backward_matches_float64(case, cute_backend):
    assert_backward_case_within_eager(case)


def test_auto_takes_the_cute_kernels():
    q, k, v = (torch.randn(1, 2, 64, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    assert gdpa_inductor.config.backend == "auto"
    assert select_forward_impl(q, k, v, None, False, "silu") == "cute"
    assert select_backward_impl(q, k, v, None, False, "silu") == "cute"
    assert select_forward_impl(q, k, v, None, True, "silu") == "cute"
    assert select_backward_impl(q, k, v, None, True, "silu") == "cute"
    assert select_backward_impl(q.float(), k.float(), v.float(), None, False, "silu") == "triton"


def test_cute_backward_nonfinite_like_eager_pattern(cute_backend):
    """A non-finite key reaches the gradients as in eager: padded queries and keys past the ends add
    nothing, not NaN."""
    assert_nonfinite_like_eager(128)


@pytest.mark.parametrize("act", ["relu", "silu"])
@pytest.mark.parametrize("nk", [512, 1024, 1025, 1280, 2048])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_dq_sums_each_within_eager_error(act, nk, dtype):
    """Every way of summing dQ that can take nk keys, forced: in place (up to DQ_DIRECT_MAX_KEY_TILES + 1 key
    tiles, one past the launcher's limit) and in fp32, each within 2x eager's error."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, do = (torch.randn(2, 4, 512, 128, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 4, nk, 128, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    scale, post = 128**-0.5, 1.0 / nk
    ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, act, scale, post)[0]
    base = rel_error(eager_grads(q, k, v, do, act, scale, post)[0], ref)
    tiles = -(-nk // 128)
    sums = ["fp32"] + ["in_place"] * (tiles <= DQ_DIRECT_MAX_KEY_TILES + 1)
    assert dq_sums_for(nk) in sums
    for how in sums:
        dq = gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, plan=dense_bwd_plan(q, k, v, act, dq_sums=how))[0]
        assert dq.dtype == dtype
        assert rel_error(dq, ref) <= 2 * base + FLOOR, (how, rel_error(dq, ref), base)


@pytest.mark.parametrize("amp", [0.3, 1.0, 3.0, 6.0])
@pytest.mark.parametrize("dq_sums, query_tile, nq, nk", [
    ("in_place", 64, 300, 1024), ("fp32", 64, 1000, 2045), ("fp32", 80, 1000, 2045)])
def test_packed_gelu_tanh_backward_within_eager_error(amp, dq_sums, query_tile, nq, nk):
    """bf16 gelu_tanh's backward on bf16x2 pairs (``activation_math.PackedBackwardForm``), inputs up to 6x randn (scores
    to ~±50, where the derivative's (1 - t²) v term needs t exactly ±1 past |u| ~ 4, which tanh.approx.bf16x2 missed):
    dq, dk and dv within 2x eager's error, every dQ sum and both query tiles, ragged ends through the fp32 twin."""
    gen = torch.Generator(device="cuda").manual_seed(nq + nk + int(10 * amp))
    q, do = (torch.randn(2, 4, nq, 128, device="cuda", generator=gen).mul(amp).bfloat16() for _ in range(2))
    k, v = (torch.randn(2, 4, nk, 128, device="cuda", generator=gen).mul(amp).bfloat16() for _ in range(2))
    scale, post = 128**-0.5, 1.0 / nk
    ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, "gelu_tanh", scale,
                                  post)[:3]
    eager = eager_grads(q, k, v, do, "gelu_tanh", scale, post)
    plan = dense_bwd_plan(q, k, v, "gelu_tanh", dq_sums=dq_sums, query_tile=query_tile)
    got = gdpa_bwd_cute(q, k, v, do, "gelu_tanh", scale, post, 0.01, plan=plan)[:3]
    for name, g, e, r in zip(("dq", "dk", "dv"), got, eager, ref):
        assert rel_error(g, r) <= 2 * rel_error(e, r) + FLOOR, (name, rel_error(g, r), rel_error(e, r))


@pytest.mark.parametrize("act", ["relu", "silu", "gelu_tanh", "sigmoid", "hardswish"])
@pytest.mark.parametrize("nq, nk", [(80, 1025), (1000, 2045), (2048, 1300)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_80_row_query_tiles_within_eager_error(act, nq, nk, dtype):
    """80-row query tiles (dQᵀ's fp32 sums in the accumulators' order, turned into dQ by the Triton pass): dq, dk and
    dv each within 2x eager's error, with queries past the last whole tile and keys past the last 128."""
    gen = torch.Generator(device="cuda").manual_seed(nq + nk)
    q, do = (torch.randn(2, 4, nq, 128, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 4, nk, 128, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    scale, post = 128**-0.5, 1.0 / nk
    ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, act, scale, post)[:3]
    eager = eager_grads(q, k, v, do, act, scale, post)
    got = gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01,
                        plan=dense_bwd_plan(q, k, v, act, dq_sums="fp32", query_tile=80))[:3]
    for name, g, e, r in zip(("dq", "dk", "dv"), got, eager, ref):
        assert g.dtype == dtype and g.shape == r.shape, name
        assert rel_error(g, r) <= 2 * rel_error(e, r) + FLOOR, (name, rel_error(g, r), rel_error(e, r))


@pytest.mark.parametrize("case", [
    ("bf16", "silu", 1, 4, 2, 2048, 1300, 128, 128), ("fp16", "relu", 1, 4, 1, 2050, 1153, 128, 128),
    ("bf16", "hardswish", 2, 2, 2, 2100, 2048, 128, 128),
], ids=lambda c: "-".join(map(str, c)))
def test_80_row_query_tiles_by_default_through_the_op(case, cute_backend, monkeypatch):
    """From 2048 queries the op's backward takes 80-row tiles for relu, silu and hardswish by itself (GQA, ragged
    lengths, fp16): dq, dk and dv within 2x eager's error."""
    monkeypatch.setattr(gdpa_inductor.config, "cute_bwd_query_tile", None)
    _, act, _, _, _, nq, nk, d, dv = case
    assert bwd_query_tile(dq_sums_for(nk), d, dv, False, False, act, nq) == LONG_QUERY_TILE
    assert_backward_case_within_eager(case)


def test_80_row_query_tiles_with_one_element_bias():
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, do = (torch.randn(2, 4, 999, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 4, 1300, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    bias = torch.tensor(-0.7, device="cuda")
    ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), bias.double(), "silu", 0.1, 0.01)
    got, base = (gdpa_bwd_cute(q, k, v, do, "silu", 0.1, 0.01, 0.01, bias=bias,
                               plan=dense_bwd_plan(q, k, v, "silu", bias=bias, dq_sums="fp32", query_tile=tile))
                 for tile in (80, 64))
    for g, b, r in zip(got[:3], base[:3], ref[:3]):
        assert rel_error(g, r) <= 1.1 * rel_error(b, r) + FLOOR


def test_80_row_query_tiles_nonfinite_like_eager():
    """A non-finite key reaches the 80-row backward's gradients as in eager: the queries past the last whole tile
    (zeros, masked) add nothing, not NaN."""
    q, do = (torch.randn(1, 2, 130, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 2, 1300, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k[0, 1, 7, 3] = float("inf")
    got = gdpa_bwd_cute(q, k, v, do, "sigmoid", 1.0, 1.0, 0.01,
                        plan=dense_bwd_plan(q, k, v, "sigmoid", dq_sums="fp32", query_tile=80))[:3]
    for g, e in zip(got, eager_grads(q, k, v, do, "sigmoid", 1.0, 1.0)):
        assert torch.equal(g.isnan(), e.isnan()) and torch.equal(g.isinf(), e.isinf())



@pytest.mark.parametrize("dq_sums", ["fp32", "in_place"])
def test_hardswish_derivative_at_its_kinks_like_eager(dq_sums):
    """Scores exactly at hardswish's kinks (±3, where eager's derivative is 0 and 1, not the middle piece's -0.5 and
    1.5: about a third of the scores here) beside scores on every piece: dq, dk and dv within 2x eager's error
    against float64. Q and K hold one nonzero column each, so that every score is an exact product of two bf16
    values. Then a NaN key: NaN reaches the gradients where it does in eager (derivative 1 at a NaN score, so dS
    stays finite and only dQ's column of that key's NaN and dV's row of it are NaN)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.zeros(1, 2, 200, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16)
    q[..., 0] = torch.tensor([3.0, -3.0, 1.5, -1.5, 6.0, -6.0, 0.25, 0.5], device="cuda", dtype=torch.bfloat16)[
        torch.randint(0, 8, (1, 2, 200), device="cuda", generator=gen)]
    k[..., 0] = torch.tensor([1.0, -1.0, 2.0, -2.0, 0.5], device="cuda", dtype=torch.bfloat16)[
        torch.randint(0, 5, (1, 2, 256), device="cuda", generator=gen)]
    v, do = (torch.randn(1, 2, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for n in (256, 200))
    ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, "hardswish", 1.0, 1.0)[:3]
    eager = eager_grads(q, k, v, do, "hardswish", 1.0, 1.0)
    plan = dense_bwd_plan(q, k, v, "hardswish", dq_sums=dq_sums)
    got = gdpa_bwd_cute(q, k, v, do, "hardswish", 1.0, 1.0, 0.01, plan=plan)[:3]
    for name, g, e, r in zip(("dq", "dk", "dv"), got, eager, ref):
        assert rel_error(g, r) <= 2 * rel_error(e, r) + FLOOR, (name, rel_error(g, r), rel_error(e, r))
    k[0, 1, 9, 0] = float("nan")
    got = gdpa_bwd_cute(q, k, v, do, "hardswish", 1.0, 1.0, 0.01, plan=plan)[:3]
    for name, g, e in zip(("dq", "dk", "dv"), got, eager_grads(q, k, v, do, "hardswish", 1.0, 1.0)):
        assert e.isnan().any() or name == "dk", name
        assert torch.equal(g.isnan(), e.isnan()) and torch.equal(g.isinf(), e.isinf()), name
