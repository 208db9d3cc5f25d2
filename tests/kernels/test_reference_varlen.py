"""The varlen reference against an independent per-sample float64 oracle: every layout (jagged self and
cross attention, PMA's shared seed block, PFFN's dense per-sample weights, a padded batch with valid
lengths), causal and windows, GQA and Dv != D, lengths 0 and 1, forward and every gradient."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import ACTIVATION_NAMES, rel_err
from varlen_testing import LAYOUTS, MASKS, bias_for, make_case, oracle

from gdpa_inductor import config, gdpa_varlen


@pytest.fixture(autouse=True)
def _reference_path():
    saved = config.backend
    config.backend = "reference"
    yield
    config.backend = saved


def check_against_oracle(case, dtype=torch.float64, tol=1e-10, bias=None, **params):
    params = dict(activation="silu", scale=0.3, post_scale=0.7) | params
    forward = oracle(case, **params)
    q64, k64, v64 = case.inputs(torch.float64)
    b64 = [] if bias is None else [bias.detach().double().requires_grad_()]
    want = forward(q64, k64, v64, *b64)
    dout = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    want_grads = torch.autograd.grad(want, (q64, k64, v64, *b64), dout)
    q, k, v = case.inputs(dtype)
    b = [] if bias is None else [bias.detach().to(dtype).requires_grad_()]
    got = gdpa_varlen(q, k, v, **case.kwargs, **params, bias=b[0] if b else None)
    got_grads = torch.autograd.grad(got, (q, k, v, *b), dout.to(dtype))
    assert got.dtype == dtype and got.shape == want.shape
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), (got, *got_grads), (want, *want_grads)):
        assert rel_err(a, b) <= tol, f"{name}: {rel_err(a, b):.3g} > {tol}"
    return got, got_grads


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_and_masks(layout, mask, gen):
    causal, window = MASKS[mask]
    check_against_oracle(make_case(layout, gen), causal=causal, window=window)


@pytest.mark.parametrize("shared", [True, False], ids=["shared_bias", "per_sample_bias"])
@pytest.mark.parametrize("mask", ["none", "hstu"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bias_and_its_gradient(layout, mask, shared, gen):
    causal, window = MASKS[mask]
    case = make_case(layout, gen)
    check_against_oracle(case, bias=bias_for(case, gen, shared), causal=causal, window=window)


def test_bias_broadcast_over_heads(gen):
    case = make_case("padded", gen)
    bias = bias_for(case, gen, shared=False)[:, :1]  # [B, 1, N, N]: one per sample, shared by the heads
    check_against_oracle(case, bias=bias, causal=True)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_activations(activation, gen):
    check_against_oracle(make_case("cross", gen, d=20, dv=12), activation=activation, causal=True,
                         window=(5, 0), scale=0.5, post_scale=1.5)


def test_fp32_and_symmetric_int_window(gen):
    check_against_oracle(make_case("self", gen, h=2, hkv=2), dtype=torch.float32, tol=1e-5, window=3)


@pytest.mark.parametrize("layout", ["self", "cross", "padded"])
def test_empty_samples_give_zeros_and_zero_gradients(layout, gen):
    case = make_case(layout, gen, lq=[0, 3, 2], lk=[4, 0, 5] if layout != "self" else None)
    got, (dq, dk, dv) = check_against_oracle(case)
    if layout == "cross":  # sample 1 has queries but no keys; sample 0 keys but no queries
        assert got[0:3].abs().sum() == 0 and dk[0:4].abs().sum() == 0 and dv[0:4].abs().sum() == 0
    if layout == "padded":  # rows past the lengths take no part
        assert got[0].abs().sum() == 0 and dq[0].abs().sum() == 0 and dk[1].abs().sum() == 0
