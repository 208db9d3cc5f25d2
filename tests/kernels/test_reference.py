"""The pure-PyTorch reference against a naive float64 loop, and its hand-written backward against autograd."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import EAGER_ACTIVATIONS, assert_close_to_reference, dtype_id, eager_gdpa, randn

from gdpa_inductor.kernels.activations import ACTIVATION_NAMES
from gdpa_inductor.kernels.reference import gdpa_reference, gdpa_reference_backward

F64 = torch.float64


def naive_gdpa(q, k, v, bias, activation, scale, post_scale, causal, negative_slope):
    """One (batch, head) at a time: broadcast batch dims by an explicit expand, kv head h // group, the
    causal rule j <= i + Nk - Nq spelled out."""
    batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    h, nq, d = q.shape[-3:]
    hkv, nk, dv = v.shape[-3:]
    group = h // hkv
    qe = q.expand(*batch, h, nq, d).reshape(-1, h, nq, d)
    ke = k.expand(*batch, hkv, nk, d).reshape(-1, hkv, nk, d)
    ve = v.expand(*batch, hkv, nk, dv).reshape(-1, hkv, nk, dv)
    be = None if bias is None else bias.expand(*batch, h, nq, nk).reshape(-1, h, nq, nk)
    keep = torch.tensor([[j <= i + nk - nq for j in range(nk)] for i in range(nq)], dtype=torch.bool)
    out = torch.empty(qe.shape[0], h, nq, dv, dtype=F64)
    for z in range(qe.shape[0]):
        for head in range(h):
            kv_head = head // group
            s = qe[z, head] @ ke[z, kv_head].T * scale
            if be is not None:
                s = s + be[z, head]
            p = EAGER_ACTIVATIONS[activation](s, negative_slope) * post_scale
            if causal:
                p = torch.where(keep, p, torch.zeros_like(p))
            out[z, head] = p @ ve[z, kv_head]
    return out.reshape(*batch, h, nq, dv)


# name: (q shape, k shape, v shape, bias shape or None, causal)
CASES = {
    "basic": ((2, 3, 7, 16), (2, 3, 9, 16), (2, 3, 9, 16), None, False),
    "odd_d25": ((2, 2, 6, 25), (2, 2, 8, 25), (2, 2, 8, 25), None, False),
    "dv_ne_d": ((2, 2, 6, 16), (2, 2, 8, 16), (2, 2, 8, 40), None, False),
    "gqa_h4_hkv2": ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), None, False),
    "mqa_h4_hkv1": ((2, 4, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), None, False),
    "bcast_q1_kv3": ((1, 4, 5, 8), (3, 2, 7, 8), (3, 2, 7, 8), None, False),
    "q_no_batch": ((4, 5, 8), (3, 4, 7, 8), (3, 4, 7, 8), None, False),
    "batch_2d_bcast": ((2, 1, 2, 5, 8), (1, 3, 2, 7, 8), (2, 3, 2, 7, 8), None, False),
    "bias_nq_nk": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), (5, 7), False),
    "bias_h_1_nk": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), (3, 1, 7), False),
    "bias_full": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), (2, 3, 5, 7), False),
    "causal_nq_lt_nk": ((2, 2, 5, 8), (2, 2, 9, 8), (2, 2, 9, 8), None, True),
    "causal_nq_gt_nk": ((2, 2, 9, 8), (2, 2, 5, 8), (2, 2, 5, 8), None, True),
    "causal_gqa_bias": ((2, 4, 6, 8), (2, 2, 6, 8), (2, 2, 6, 12), (4, 6, 6), True),
}


def _inputs(gen, case, dtype=F64):
    qs, ks, vs, bs, causal = CASES[case]
    q, k, v = (randn(gen, *s, dtype=dtype) for s in (qs, ks, vs))
    bias = randn(gen, *bs, dtype=dtype, scale=0.5) if bs is not None else None
    return q, k, v, bias, causal


def _params(activation, d):
    return dict(activation=activation, scale=0.7 / d**0.5, post_scale=0.8, negative_slope=0.2)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_reference_matches_naive_loop(activation, case, gen):
    q, k, v, bias, causal = _inputs(gen, case)
    kw = _params(activation, q.shape[-1])
    out = gdpa_reference(q, k, v, bias, causal=causal, **kw)
    expected = naive_gdpa(q, k, v, bias, causal=causal, **kw)
    assert out.shape == expected.shape
    assert out.is_contiguous()
    assert_close_to_reference(out, expected, dtype=F64, what="out")


@pytest.mark.parametrize("activation", ["sigmoid", "gelu", "hardswish"])
def test_fully_masked_causal_rows_are_zero(activation, gen):
    """With Nq > Nk the first Nq - Nk query rows see no key at all: their output is exactly 0 even though
    act(0) != 0 for these activations."""
    q, k, v, bias, causal = _inputs(gen, "causal_nq_gt_nk")
    out = gdpa_reference(q, k, v, None, causal=True, **_params(activation, q.shape[-1]))
    n_masked = q.shape[-2] - k.shape[-2]
    assert torch.equal(out[..., :n_masked, :], torch.zeros_like(out[..., :n_masked, :]))
    assert (out[..., n_masked:, :] != 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("activation", ["gelu", "silu", "relu_square"])
def test_reference_half_inputs(activation, dtype, gen):
    """Half inputs are computed in fp32 and cast back: value's dtype, and at least as accurate as eager."""
    q, k, v, bias, _ = _inputs(gen, "bias_full", dtype=dtype)
    kw = _params(activation, q.shape[-1])
    out = gdpa_reference(q, k, v, bias, causal=True, **kw)
    assert out.dtype == dtype
    ref = naive_gdpa(*(t.to(F64) for t in (q, k, v, bias)), causal=True, **kw)
    eager = eager_gdpa(q, k, v, bias, causal=True, **kw)
    assert_close_to_reference(out, ref, dtype=dtype, eager=eager, what="out")


BWD_CASES = [
    pytest.param(case, bias_grad, id=f"{case}-{'dbias' if bias_grad else 'no_dbias'}")
    for case, spec in CASES.items()
    for bias_grad in ((True, False) if spec[3] is not None else (False,))
]


@pytest.mark.parametrize("case, bias_grad", BWD_CASES)
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_reference_backward_matches_autograd(activation, case, bias_grad, gen):
    q, k, v, bias, causal = _inputs(gen, case)
    kw = _params(activation, q.shape[-1])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if bias is not None:
        leaves.append(bias.clone().requires_grad_(bias_grad))
    out = gdpa_reference(*leaves[:3], leaves[3] if bias is not None else None, causal=causal, **kw)
    dout = randn(gen, *out.shape, dtype=F64)
    wrt = [t for t in leaves if t.requires_grad]
    expected = torch.autograd.grad(out, wrt, dout)

    dq, dk, dv, dbias = gdpa_reference_backward(dout, q, k, v, bias, causal=causal, bias_requires_grad=bias_grad, **kw)
    got = [dq, dk, dv] + ([dbias] if bias_grad else [])
    if not bias_grad:
        assert dbias is None
    for name, g, e, leaf in zip(("dq", "dk", "dv", "dbias"), got, expected, wrt):
        # Broadcast inputs get their gradient summed back to the input's own shape.
        assert g.shape == leaf.shape, f"{name}: shape {tuple(g.shape)} != input {tuple(leaf.shape)}"
        assert g.dtype == leaf.dtype and g.is_contiguous()
        assert_close_to_reference(g, e, dtype=F64, what=name)
