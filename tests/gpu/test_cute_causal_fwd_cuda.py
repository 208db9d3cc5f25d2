"""GPU correctness of the CuTe-DSL Hopper forward's causal mask (bottom-right aligned, Nk - Nq a multiple of 128;
skipped without an sm_90 GPU and nvidia-cutlass-dsl): against float64 within 2x eager's own error, over
activations, ragged lengths, Nk > Nq, GQA, head dims, fp16 and bf16, several query tiles a CTA; all schedules give
the same bits; a non-finite key reaches only the rows that keep it; the grid coprime with the query tiles gives
the bits of the one-CTA-per-SM grid. Through ``config.backend = "cute"``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.activations import get_activation
from gdpa_inductor.kernels.cute import gdpa_fwd as cute_fwd
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute, plan_dense_fwd
from gdpa_inductor.kernels.reference import band_keep_mask, gdpa_reference
from gdpa_inductor.lowering import dispatch

from .cute_common import DTYPES, FLOOR, NEEDS_CUTE, rel_error

pytestmark = NEEDS_CUTE

# (dtype, activation, Z, H, Hkv, Nq, Nk, D, Dv)
CAUSAL_CASES = [
    ("bf16", "gelu_tanh", 2, 4, 4, 300, 300, 128, 128),
    ("fp16", "silu", 2, 4, 2, 257, 385, 128, 128),
    ("bf16", "relu", 40, 4, 4, 512, 512, 64, 64),
    ("bf16", "sigmoid", 1, 2, 2, 17, 145, 128, 128),
    ("bf16", "gelu", 3, 4, 4, 1000, 1128, 96, 128),
    ("bf16", "silu", 2, 8, 2, 2048, 2048, 128, 128),
    ("fp16", "gelu_tanh", 60, 4, 4, 200, 200, 128, 64),
    ("bf16", "relu_square", 2, 4, 4, 128, 128, 128, 128),
]


def eager_causal(q, k, v, activation, scale, post_scale):
    """The causal math as plain torch ops in the inputs' dtype: masked scores give P = 0."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    keep = band_keep_mask(q.shape[-2], k.shape[-2], True, (-1, -1), q.device)
    p = get_activation(activation).torch_fn(q @ k.transpose(-2, -1) * scale, 0.01).masked_fill(~keep, 0)
    return p * post_scale @ v


def _qkv(z, h, hkv, nq, nk, d, dv, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(z, h, nq, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(z, hkv, nk, dv, device="cuda", dtype=dtype, generator=gen)
    return q, k, v


@pytest.mark.parametrize("case", CAUSAL_CASES, ids=lambda c: "-".join(map(str, c)))
def test_causal_forward_matches_float64(case, cute_backend):
    dtype_name, act, z, h, hkv, nq, nk, d, dv = case
    q, k, v = _qkv(z, h, hkv, nq, nk, d, dv, DTYPES[dtype_name], 1)
    scale, post = d**-0.5, 1.0 / nk
    assert dispatch.select_forward_impl(q, k, v, None, True, act) == "cute"
    ref = gdpa_reference(q.double(), k.double(), v.double(), None, act, scale, post, causal=True)
    out = gdpa(q, k, v, activation=act, scale=scale, post_scale=post, causal=True)
    assert out.shape == (z, h, nq, dv)
    assert rel_error(out, ref) <= 2 * rel_error(eager_causal(q, k, v, act, scale, post), ref) + FLOOR


@pytest.mark.parametrize("nq, nk", [(700, 700), (700, 956)])
def test_causal_schedules_change_no_bit(nq, nk):
    """Ping-pong and split O stores only order the work: the same bits, with several query tiles per CTA, which
    under the causal mask run longest first and differ in their key tiles."""
    q, k, v = _qkv(30, 4, 4, nq, nk, 128, 128, torch.bfloat16, 2)
    plan = plan_dense_fwd(q, k, v, "gelu_tanh", causal=True)
    outs = [gdpa_fwd_cute(q, k, v, "gelu_tanh", 128**-0.5, 1e-3, 0.01, causal=True,
                          plan=dataclasses.replace(plan, pingpong=pp, split_store=split))
            for pp in (True, False) for split in (True, False)]
    assert torch.isfinite(outs[0]).all()
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "silu"])
def test_causal_nonfinite_key_reaches_only_rows_that_keep_it(act, cute_backend):
    """An infinite key spreads over the rows that keep it and nowhere else, as in eager: the rows before it
    (inside its own diagonal tile and in earlier query tiles) stay finite."""
    q, k, v = _qkv(1, 2, 2, 300, 300, 128, 128, torch.bfloat16, 3)
    k[0, 0, 200, 5] = float("inf")
    out = gdpa(q, k, v, activation=act, causal=True)
    expected = eager_causal(q, k, v, act, 1.0, 1.0)
    assert torch.equal(out.isnan(), expected.isnan()) and torch.equal(out.isinf(), expected.isinf())
    assert torch.isfinite(out[0, 0, :200]).all() and not torch.isfinite(out[0, 0, 200:]).all()


def test_causal_grid_changes_no_bit(monkeypatch):
    """The grid coprime with the query tiles (``persistent_grid``) only hands the tiles to other CTAs: the same bits
    as the one-CTA-per-SM grid, with several tiles per CTA."""
    q, k, v = _qkv(60, 4, 4, 1024, 1152, 128, 128, torch.bfloat16, 4)
    balanced = gdpa_fwd_cute(q, k, v, "silu", 128**-0.5, 1e-3, 0.01, causal=True)
    monkeypatch.setattr(cute_fwd, "persistent_grid", lambda tiles, sms, num_m, causal: min(tiles, sms))
    assert torch.equal(gdpa_fwd_cute(q, k, v, "silu", 128**-0.5, 1e-3, 0.01, causal=True), balanced)
