"""The public ``gdpa_inductor.gdpa``: values and gradients against the float64 reference, the meaning of
its arguments, argument validation, and NaN/inf behaviour. With the interpreter on (no GPU), fp32 calls
run the Triton kernels and fp64 calls the reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gdpa_testing import EAGER_ACTIVATIONS, assert_close_to_reference, default_scale, dtype_id, randn, reference64

from gdpa_inductor import config, gdpa
from gdpa_inductor.kernels.activations import ACTIVATION_NAMES
from gdpa_inductor.kernels.reference import gdpa_reference_backward

F64 = torch.float64
DTYPES = [torch.float32, torch.float64]

pytestmark = [
    pytest.mark.usefixtures("poison_empty"),
    # The exp-based tanh of the interpreter path overflows to inf for large |x| by design.
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

# name: (q shape, k shape, v shape, bias shape or None, causal)
SHAPES = {
    "odd_d25_dv40": ((2, 2, 12, 25), (2, 2, 20, 25), (2, 2, 20, 40), None, False),
    "gqa_bias_full": ((2, 4, 12, 16), (2, 2, 20, 16), (2, 2, 20, 16), (2, 4, 12, 20), False),
    "pma_bias_h_1_nk": ((1, 2, 6, 16), (3, 2, 20, 16), (3, 2, 20, 16), (2, 1, 20), False),
    "q_no_batch_mqa": ((4, 6, 16), (3, 1, 20, 16), (3, 1, 20, 16), None, False),
    "causal_nq10_nk24_bias": ((2, 2, 10, 16), (2, 2, 24, 16), (2, 2, 24, 16), (10, 24), True),
    "causal_nq24_nk10_bias_full": ((2, 2, 24, 16), (2, 2, 10, 16), (2, 2, 10, 16), (2, 2, 24, 10), True),
}


def _inputs(gen, shape, dtype, requires_grad=True):
    qs, ks, vs, bs, causal = SHAPES[shape]
    q, k, v = (randn(gen, *s, dtype=dtype).requires_grad_(requires_grad) for s in (qs, ks, vs))
    bias = randn(gen, *bs, dtype=dtype, scale=0.5).requires_grad_(requires_grad) if bs is not None else None
    return q, k, v, bias, causal


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "dtype, forced",
    [(torch.float32, "auto"), (torch.float32, "reference"), (torch.float64, "auto")],
    ids=["float32", "float32-reference", "float64"],
)
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_gdpa_vs_reference(activation, dtype, forced, shape, gen, monkeypatch):
    """fp32 through the default dispatch (the Triton kernels when interpreting) and through the reference
    path a CPU-only user gets; fp64 always takes the reference path."""
    monkeypatch.setattr(config, "backend", forced)
    q, k, v, bias, causal = _inputs(gen, shape, dtype)
    kw = dict(activation=activation, scale=default_scale(q.shape[-1]), post_scale=0.7, causal=causal,
              negative_slope=0.2)
    out = gdpa(q, k, v, bias=bias, **kw)
    assert out.dtype == v.dtype
    assert_close_to_reference(out, reference64(q, k, v, bias, **kw), dtype=dtype, what="out")

    dout = randn(gen, *out.shape, dtype=dtype)
    leaves = [t for t in (q, k, v, bias) if t is not None]
    grads = torch.autograd.grad(out, leaves, dout)
    expected = gdpa_reference_backward(
        *(t.detach().to(F64) if t is not None else None for t in (dout, q, k, v, bias)),
        bias_requires_grad=bias is not None, **kw,
    )
    for name, g, e, leaf in zip(("dq", "dk", "dv", "dbias"), grads, expected, leaves):
        assert g.shape == leaf.shape and g.dtype == dtype, name
        assert_close_to_reference(g, e, dtype=dtype, what=name)


def _manual(q, k, v, act, scale, post_scale, bias=None):
    """act(scale * Q K^T + bias) * post_scale @ V in float64, written out."""
    q, k, v = (t.detach().to(F64) for t in (q, k, v))
    s = scale * (q @ k.transpose(-2, -1))
    if bias is not None:
        s = s + bias.detach().to(F64)
    return (act(s) * post_scale) @ v


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_scale_none_means_one(dtype, gen):
    q, k, v, _, _ = _inputs(gen, "odd_d25_dv40", dtype, requires_grad=False)
    out = gdpa(q, k, v, activation="gelu", scale=None)
    assert_close_to_reference(out, _manual(q, k, v, F.gelu, 1.0, 1.0), dtype=dtype, what="scale=None")
    # Not the softmax-attention habit of 1/sqrt(D): GELU is not scale-invariant, so that would differ.
    implicit = _manual(q, k, v, F.gelu, 1.0 / math.sqrt(q.shape[-1]), 1.0)
    assert not torch.allclose(out.to(F64), implicit, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("activation", ["gelu", "silu", "sigmoid"])
def test_post_scale_after_activation(activation, dtype, gen):
    q, k, v, _, _ = _inputs(gen, "odd_d25_dv40", dtype, requires_grad=False)
    bias = randn(gen, 12, 20, dtype=dtype)
    act = lambda s: EAGER_ACTIVATIONS[activation](s, 0.01)  # noqa: E731
    out = gdpa(q, k, v, activation=activation, scale=0.3, post_scale=0.05, bias=bias)
    assert_close_to_reference(out, _manual(q, k, v, act, 0.3, 0.05, bias), dtype=dtype, what="post_scale")
    # Applying it before the activation (or folding it into scale) gives something else for these.
    before = _manual(q, k, v, lambda s: act(0.05 * s), 0.3, 1.0, bias)
    assert not torch.allclose(out.to(F64), before, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("slope", [0.0, 0.01, 0.3, -0.5])
def test_leaky_relu_negative_slope(slope, dtype, gen):
    q, k, v, _, _ = _inputs(gen, "gqa_bias_full", dtype, requires_grad=False)
    k, v = (t.repeat_interleave(2, dim=-3) for t in (k, v))
    out = gdpa(q, k, v, activation="leaky_relu", negative_slope=slope, scale=0.25)
    expected = _manual(q, k, v, lambda s: F.leaky_relu(s, slope), 0.25, 1.0)
    assert_close_to_reference(out, expected, dtype=dtype, what=f"slope {slope}")
    default = gdpa(q, k, v, activation="leaky_relu", scale=0.25)
    assert torch.equal(out, default) == (slope == 0.01)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=dtype_id)
def test_output_dtype_is_value_dtype(dtype, gen):
    q, k, v, bias, causal = _inputs(gen, "causal_nq10_nk24_bias", dtype, requires_grad=False)
    out = gdpa(q, k, v, bias=bias, causal=causal)
    assert out.dtype == dtype and out.shape == (2, 2, 10, 16)


def test_default_activation_is_gelu_tanh(gen):
    q, k, v, _, _ = _inputs(gen, "odd_d25_dv40", F64, requires_grad=False)
    expected = _manual(q, k, v, lambda s: F.gelu(s, approximate="tanh"), 1.0, 1.0)
    assert_close_to_reference(gdpa(q, k, v), expected, dtype=F64, what="default activation")


# ---- argument validation: ValueError whose message starts with the argument's name ----

def _qkv(gen, q=(2, 4, 5, 8), k=(2, 2, 7, 8), v=(2, 2, 7, 8), dtype=torch.float32):
    return [randn(gen, *s, dtype=dtype) for s in (q, k, v)]


INVALID = {
    "key_head_dim": ("key", lambda g: (_qkv(g, k=(2, 2, 7, 9)), {})),
    "heads_not_divisible": ("query", lambda g: (_qkv(g, q=(2, 3, 5, 8)), {})),
    "key_on_meta": ("key", lambda g: ([*_qkv(g)[:1], torch.empty(2, 2, 7, 8, device="meta"), _qkv(g)[2]], {})),
    "value_on_meta": ("value", lambda g: ([*_qkv(g)[:2], torch.empty(2, 2, 7, 8, device="meta")], {})),
    "bias_on_meta": ("bias", lambda g: (_qkv(g), {"bias": torch.empty(5, 7, device="meta")})),
    "key_dtype": ("key", lambda g: ([_qkv(g)[0], *_qkv(g, dtype=F64)[1:]], {})),
    "value_dtype": ("value", lambda g: ([*_qkv(g)[:2], _qkv(g, dtype=F64)[2]], {})),
    "bias_dtype": ("bias", lambda g: (_qkv(g), {"bias": torch.zeros(5, 7, dtype=F64)})),
    "integer_query": ("query", lambda g: ([torch.ones(2, 4, 5, 8, dtype=torch.int32), *_qkv(g)[1:]], {})),
    "unknown_activation": ("activation", lambda g: (_qkv(g), {"activation": "softmax"})),
    "bias_not_broadcastable": ("bias", lambda g: (_qkv(g), {"bias": torch.zeros(5, 6)})),
    "bias_too_many_dims": ("bias", lambda g: (_qkv(g), {"bias": torch.zeros(3, 2, 4, 5, 7)})),
    "query_2d": ("query", lambda g: ([torch.zeros(5, 8), *_qkv(g)[1:]], {})),
    "key_2d": ("key", lambda g: ([_qkv(g)[0], torch.zeros(7, 8), _qkv(g)[2]], {})),
    "value_2d": ("value", lambda g: ([*_qkv(g)[:2], torch.zeros(7, 8)], {})),
    "query_not_tensor": ("query", lambda g: ([[[[1.0]]], *_qkv(g)[1:]], {})),
    "value_not_tensor": ("value", lambda g: ([*_qkv(g)[:2], 3.0], {})),
    "bias_not_tensor": ("bias", lambda g: (_qkv(g), {"bias": 0.5})),
    "value_other_length": ("value", lambda g: (_qkv(g, v=(2, 2, 6, 8)), {})),
    "value_other_heads": ("value", lambda g: (_qkv(g, v=(2, 4, 7, 8)), {})),
    "batch_not_broadcastable": ("key/value", lambda g: (_qkv(g, k=(3, 2, 7, 8), v=(3, 2, 7, 8)), {})),
    "complex_scale": ("scale", lambda g: (_qkv(g), {"scale": 1j})),
    "string_scale": ("scale", lambda g: (_qkv(g), {"scale": "0.5"})),
    "bool_scale": ("scale", lambda g: (_qkv(g), {"scale": True})),
    "tensor_post_scale": ("post_scale", lambda g: (_qkv(g), {"post_scale": torch.tensor([0.5, 0.5])})),
    "none_negative_slope": ("negative_slope", lambda g: (_qkv(g), {"negative_slope": None})),
}


@pytest.mark.parametrize("case", INVALID)
def test_invalid_arguments(case, gen):
    name, make = INVALID[case]
    args, kwargs = make(gen)
    with pytest.raises(ValueError) as info:
        gdpa(*args, **kwargs)
    assert str(info.value).startswith(f"{name}: "), str(info.value)


# Scales must be finite and flags bools: nan, inf, "yes" or 1 are mistakes that would otherwise run silently.
REFUSED = {
    "nan_scale": ({"scale": float("nan")}, r"^scale: expected a finite number \(not nan or inf\); got nan$"),
    "inf_scale": ({"scale": float("inf")}, r"^scale: expected a finite number \(not nan or inf\); got inf$"),
    "int_past_float_scale": ({"scale": 10**400}, r"^scale: expected a finite number \(not nan or inf\); got 1000"),
    "nan_post_scale": ({"post_scale": math.nan}, r"^post_scale: expected a finite number \(not nan or inf\); got nan$"),
    "neg_inf_post_scale": ({"post_scale": -math.inf},
                           r"^post_scale: expected a finite number \(not nan or inf\); got -inf$"),
    "nan_negative_slope": ({"activation": "leaky_relu", "negative_slope": math.nan},
                           r"^negative_slope: expected a finite number \(not nan or inf\); got nan$"),
    "string_causal": ({"causal": "yes"}, r"^causal: expected a bool \(True or False\); got 'yes' \(str\)$"),
    "int_causal": ({"causal": 1}, r"^causal: expected a bool \(True or False\); got 1 \(int\)$"),
    "none_causal": ({"causal": None}, r"^causal: expected a bool \(True or False\); got None \(NoneType\)$"),
    "tensor_causal": ({"causal": torch.tensor(True)},
                      r"^causal: expected a bool \(True or False\); got a torch.bool tensor of shape \(\) "
                      r"\(pass bool\(t\)\)$"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_non_finite_scales_and_non_bool_flags_are_refused(case, gen):
    kwargs, message = REFUSED[case]
    with pytest.raises(ValueError, match=message):
        gdpa(*_qkv(gen), **kwargs)


def test_causal_takes_numpy_bools(gen):
    np = pytest.importorskip("numpy")
    q, k, v = _qkv(gen, q=(2, 2, 5, 8), k=(2, 2, 5, 8), v=(2, 2, 5, 8), dtype=F64)
    outs = {value: gdpa(q, k, v, causal=value) for value in (True, False)}
    assert not torch.equal(outs[True], outs[False])
    for value in (True, False):
        assert torch.equal(gdpa(q, k, v, causal=np.bool_(value)), outs[value])


def test_checks_take_shape_derived_scale_and_causal_under_dynamic_shapes(gen):
    # torch.compile traces them as symbolic floats and bools: checked without a graph break.
    q, k, v = _qkv(gen, q=(2, 2, 5, 8), k=(2, 2, 5, 8), v=(2, 2, 5, 8), dtype=F64)
    f = lambda q, k, v: gdpa(q, k, v, scale=q.shape[-1] ** -0.5, causal=q.shape[-2] > 2)  # noqa: E731
    torch._dynamo.reset()
    try:
        out = torch.compile(f, backend="eager", fullgraph=True, dynamic=True)(q, k, v)
    finally:
        torch._dynamo.reset()
    assert torch.equal(out, gdpa(q, k, v, scale=8**-0.5, causal=True))


# ---- NaN and inf behave as in eager float64 math ----

def _poison(t, where, value):
    t = t.clone()
    t[where] = value
    return t


POISON = {
    "nan_in_query": ("q", (0, 1, 3, 2), float("nan")),
    "inf_in_query": ("q", (1, 0, 5, 4), float("inf")),
    "neg_inf_in_query": ("q", (0, 0, 2, 1), float("-inf")),
    "nan_in_key": ("k", (1, 1, 7, 0), float("nan")),
    "nan_in_value": ("v", (0, 1, 9, 3), float("nan")),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("poison", POISON)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_nan_inf_like_eager(activation, dtype, poison, gen):
    """The same output entries are NaN (and the same are +-inf) as the float64 reference on the same
    inputs. Nk = 50 leaves a ragged last key tile in the kernels."""
    q, k, v = (randn(gen, 2, 2, n, 16, dtype=dtype) for n in (12, 50, 50))
    which, where, value = POISON[poison]
    tensors = {"q": q, "k": k, "v": v}
    tensors[which] = _poison(tensors[which], where, value)
    kw = dict(activation=activation, scale=0.25, post_scale=1.0, causal=False, negative_slope=0.01)
    out = gdpa(tensors["q"], tensors["k"], tensors["v"], **kw)
    ref = reference64(tensors["q"], tensors["k"], tensors["v"], **kw)
    nan_rows = lambda t: t.isnan().any(-1).nonzero().tolist()  # noqa: E731
    same_nan = torch.equal(out.isnan(), ref.isnan())
    assert same_nan, f"NaN rows {nan_rows(out)}, eager float64 {nan_rows(ref)}"
    same_finite = torch.equal(out.isfinite(), ref.isfinite()) and torch.equal(out.isposinf(), ref.isposinf())
    assert same_finite, "the +-inf entries differ from eager float64"
