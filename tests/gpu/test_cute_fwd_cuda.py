"""GPU correctness of the CuTe-DSL Hopper forward (skipped without an sm_90 GPU and nvidia-cutlass-dsl;
on the lent H200 cutlass-dsl is staged with ../shared/device/stage-cute-dsl.sh).

Against a float64 reference, the CuTe forward's relative error is at most 2x eager PyTorch's own error in
the same dtype at the same inputs, over every activation, ragged lengths (TMA's zero fill plus the last key
tile's mask), GQA, D and Dv in {64, 96, 128}, fp16 and bf16, through the op with ``config.backend = "cute"``.
"""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference

from .cute_common import CASES, DTYPES, FLOOR, NEEDS_CUTE, eager_gdpa, rel_error

pytestmark = NEEDS_CUTE


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_cute_forward_matches_float64(case, cute_backend):
    dtype_name, act, z, h, hkv, nq, nk, d, dv = case
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(z, h, nq, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(z, hkv, nk, dv, device="cuda", dtype=dtype, generator=gen)
    scale, post = d**-0.5, 1.0 / nk
    ref = gdpa_reference(q.double(), k.double(), v.double(), None, act, scale, post)
    out = gdpa(q, k, v, activation=act, scale=scale, post_scale=post)
    assert out.dtype == dtype and out.shape == (z, h, nq, dv)
    assert rel_error(out, ref) <= 2 * rel_error(eager_gdpa(q, k, v, act, scale, post), ref) + FLOOR


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
@pytest.mark.parametrize(
    ("magnitude", "scale"), [(0.2, None), (3.0, None), (1.0, 1.0)], ids=["small", "large", "unscaled"]
)
def test_cute_forward_packed_forms_across_score_ranges(act, magnitude, scale, cute_backend):
    """bf16 gelu_tanh and silu run on bf16x2 pairs (tanh argument and P rounded to bf16): their error stays
    within 2x eager's where the scores are small, large, and unscaled (scale 1: scores of tens)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(2, 4, 512, 128, device="cuda", dtype=torch.bfloat16, generator=gen) * magnitude
    k = torch.randn(2, 4, 700, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(2, 4, 700, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = 128**-0.5 if scale is None else scale
    ref = gdpa_reference(q.double(), k.double(), v.double(), None, act, scale, 1e-3)
    out = gdpa(q, k, v, activation=act, scale=scale, post_scale=1e-3)
    assert rel_error(out, ref) <= 2 * rel_error(eager_gdpa(q, k, v, act, scale, 1e-3), ref) + FLOOR


@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("nk", [200, 600])
def test_cute_forward_nonfinite_like_eager_pattern(act, nk, cute_backend):
    """A non-finite query spreads over its row only: padded keys past Nk add nothing, not NaN (with and
    without ping-pong; gelu_tanh and silu in their folded-scale bf16 forms)."""
    q = torch.randn(1, 2, 130, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, nk, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q[0, 0, 3, 5] = float("inf")
    out = gdpa(q, k, v, activation=act)
    expected = eager_gdpa(q, k, v, act, 1.0, 1.0)
    assert torch.equal(out.isnan(), expected.isnan()) and torch.equal(out.isinf(), expected.isinf())


@pytest.mark.parametrize("act", ["gelu_tanh", "silu", "relu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("nk", [1000, 1024], ids=["ragged", "exact"])
def test_cute_forward_schedules_change_no_bit(act, dtype, nk):
    """Ping-pong only orders when each consumer warpgroup issues its matmuls, and a split O store only who
    stores which rows: all four schedules give the same bits, with several tiles per CTA (a race in the turns,
    the stores or the steps that cross into the next tile would show here)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(30, 4, 700, 128, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(30, 4, nk, 128, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(30, 4, nk, 128, device="cuda", dtype=dtype, generator=gen)
    outs = [gdpa_fwd_cute(q, k, v, act, 128**-0.5, 1e-3, 0.01, pingpong=pp, split_store=split)
            for pp in (True, False) for split in (True, False)]
    assert torch.isfinite(outs[0]).all()
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize(("d", "dv"), [(96, 96), (128, 64), (64, 128)])
def test_cute_forward_schedules_agree_across_head_dims(d, dv):
    """The four schedules at D = 96 and at Dv != D (O's tile, its stores and the P·V matmul take Dv, the
    Q Kᵀ matmul D) give the same bits, with several tiles per CTA and a ragged last key tile."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    q = torch.randn(30, 4, 700, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(30, 4, 1000, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(30, 4, 1000, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
    outs = [gdpa_fwd_cute(q, k, v, "gelu_tanh", d**-0.5, 1e-3, 0.01, pingpong=pp, split_store=split)
            for pp in (True, False) for split in (True, False)]
    assert outs[0].shape == (30, 4, 700, dv) and torch.isfinite(outs[0]).all()
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
