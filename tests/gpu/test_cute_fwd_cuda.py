"""GPU correctness of the CuTe-DSL Hopper forward (skipped without an sm_90 GPU and nvidia-cutlass-dsl;
on the lent H200 cutlass-dsl is staged with ../shared/device/stage-cute-dsl.sh).

Against a float64 reference, the CuTe forward's relative error is at most 2x eager PyTorch's own error in
the same dtype at the same inputs, over every activation, ragged lengths (TMA's zero fill plus the last key
tile's mask), GQA, D and Dv in {64, 96, 128} and the wide-head tiles at 256 (64-key tiles, O stored from the
registers with rows past Nq left alone), fp16 and bf16, through the op with ``config.backend = "cute"``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute, plan_dense_fwd
from gdpa_inductor.kernels.reference import gdpa_reference

from .cute_common import CASES, DTYPES, FLOOR, NEEDS_CUTE, eager_gdpa, rel_error

pytestmark = NEEDS_CUTE

# head dims past 128 (the forward only): ragged, an exact 64-key tile, GQA with several tiles per CTA, fp16
WIDE_HEAD_CASES = [
    ("bf16", "gelu_tanh", 2, 4, 4, 300, 300, 256, 256),
    ("bf16", "silu", 40, 4, 2, 300, 200, 256, 256),
    ("fp16", "relu", 2, 4, 4, 257, 1000, 128, 256),
    ("bf16", "gelu", 3, 4, 4, 130, 64, 256, 64),
    ("bf16", "sigmoid", 1, 2, 2, 17, 2048, 256, 256),
]

# D = Dv = 64 in its own schedule (ping-pong, split O stores, three K/V stages): several query tiles per CTA, key
# tiles a multiple of the stages and not, ragged and exact, GQA, fp16 and bf16
D64_CASES = [
    ("fp16", "silu", 24, 4, 4, 700, 1000, 64, 64),
    ("bf16", "gelu_tanh", 24, 4, 4, 700, 768, 64, 64),
    ("bf16", "relu", 50, 4, 2, 129, 1152, 64, 64),
]


@pytest.mark.parametrize("case", CASES + WIDE_HEAD_CASES + D64_CASES, ids=lambda c: "-".join(map(str, c)))
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
@pytest.mark.parametrize("d", [128, 256])
def test_cute_forward_nonfinite_like_eager_pattern(act, nk, d, cute_backend):
    """A non-finite query spreads over its row only: padded keys past Nk add nothing, not NaN (with and
    without ping-pong; gelu_tanh and silu in their folded-scale bf16 forms; 64-key tiles at D = 256)."""
    q = torch.randn(1, 2, 130, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, nk, d, device="cuda", dtype=torch.bfloat16)
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
    plan = plan_dense_fwd(q, k, v, act)
    outs = [gdpa_fwd_cute(q, k, v, act, 128**-0.5, 1e-3, 0.01,
                          plan=dataclasses.replace(plan, pingpong=pp, split_store=split))
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
    plan = plan_dense_fwd(q, k, v, "gelu_tanh")
    outs = [gdpa_fwd_cute(q, k, v, "gelu_tanh", d**-0.5, 1e-3, 0.01,
                          plan=dataclasses.replace(plan, pingpong=pp, split_store=split))
            for pp in (True, False) for split in (True, False)]
    assert outs[0].shape == (30, 4, 700, dv) and torch.isfinite(outs[0]).all()
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


def test_wide_head_rows_past_nq_untouched():
    """O goes from the registers to global memory at D = 256: the rows of the last query tile past Nq are not
    written. O is a view of the first 200 rows of a 256-row buffer: the 56 after them keep their sevens."""
    q = torch.randn(2, 4, 200, 256, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, 300, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    buffer = torch.full((2, 4, 256, 256), 7.0, device="cuda", dtype=torch.bfloat16)
    out = gdpa_fwd_cute(q, k, v, "silu", 256**-0.5, 1.0, 0.01, out=buffer[:, :, :200])
    ref = gdpa_reference(q.double(), k.double(), v.double(), None, "silu", 256**-0.5, 1.0)
    assert rel_error(out, ref) <= 2 * rel_error(eager_gdpa(q, k, v, "silu", 256**-0.5, 1.0), ref) + FLOOR
    assert torch.equal(buffer[:, :, 200:], torch.full_like(buffer[:, :, 200:], 7.0))


def test_wide_head_trains_on_the_cute_kernels(monkeypatch):
    """Under "auto" at D = 256 (from 1024 keys) the forward and the backward run the CuTe kernels (the wide-head
    backward since the twenty-eighth session); every gradient within 2x eager's error against float64."""
    import gdpa_inductor
    from gdpa_inductor.lowering import dispatch

    monkeypatch.setattr(gdpa_inductor.config, "backend", "auto")
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 4, n, 256, device="cuda", dtype=torch.bfloat16, generator=gen) for n in (300, 1100, 1100))
    do = torch.randn(2, 4, 300, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    assert dispatch.select_forward_impl(q, k, v, None, False, "gelu_tanh") == "cute"
    assert dispatch.select_backward_impl(q, k, v, None, False, "gelu_tanh") == "cute"
    scale, post = 256**-0.5, 1.0 / 1100

    def grads(fn, *xs):
        xs = [x.detach().requires_grad_() for x in xs]
        fn(*xs).backward(do.to(xs[0].dtype))
        return [x.grad for x in xs]

    got = grads(lambda a, b, c: gdpa(a, b, c, activation="gelu_tanh", scale=scale, post_scale=post), q, k, v)
    ref = grads(lambda a, b, c: gdpa_reference(a, b, c, None, "gelu_tanh", scale, post), q.double(), k.double(),
                v.double())
    eager = grads(lambda a, b, c: eager_gdpa(a, b, c, "gelu_tanh", scale, post), q, k, v)
    for g, r, e in zip(got, ref, eager):
        assert rel_error(g, r) <= 2 * rel_error(e, r) + FLOOR
