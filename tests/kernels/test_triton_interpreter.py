"""The Triton forward and backward kernels, launched directly and run by the Triton interpreter on CPU
tensors, against the float64 reference. fp32 must be fp32-accurate; fp16 must be within 2x of eager
PyTorch's own fp16 error (bf16 is not run: the interpreter computes it wrongly)."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import (
    assert_close_to_reference,
    default_scale,
    dtype_id,
    eager_gdpa,
    randn,
    reference64,
    requires_interpreter,
)

from gdpa_inductor.kernels.activations import ACTIVATION_NAMES
from gdpa_inductor.kernels.reference import gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton
from gdpa_inductor.kernels.triton.tile_configs import BwdConfig, FwdConfig

pytestmark = [
    requires_interpreter,
    pytest.mark.usefixtures("poison_empty"),
    # The exp-based tanh of the interpreter path overflows to inf for large |x| by design.
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

DTYPES = [torch.float16, torch.float32]
GRID_ACTIVATIONS = ["gelu", "silu", "leaky_relu"]
F64 = torch.float64


def _make(qs, ks, vs, bs=None, causal=False):
    def build(gen, dtype):
        q, k, v = (randn(gen, *s, dtype=dtype) for s in (qs, ks, vs))
        bias = randn(gen, *bs, dtype=dtype, scale=0.5) if bs is not None else None
        return q, k, v, bias, causal

    return build


def _non_contiguous(gen, dtype):
    """q from a [B, N, H, D] projection, k every other row of a longer buffer, v and bias stored transposed."""
    b, h, nq, nk, d = 2, 2, 40, 56, 32
    q = randn(gen, b, nq, h, d, dtype=dtype).permute(0, 2, 1, 3)
    k = randn(gen, b, h, 2 * nk, d, dtype=dtype)[..., ::2, :]
    v = randn(gen, b, h, d, nk, dtype=dtype).transpose(-2, -1)
    bias = randn(gen, b, h, nk, nq, dtype=dtype, scale=0.5).transpose(-2, -1)
    assert not any(t.is_contiguous() for t in (q, k, v, bias))
    return q, k, v, bias, False


REPRESENTATIVE = {
    "plain": _make((2, 2, 72, 32), (2, 2, 80, 32), (2, 2, 80, 32)),
    # one sample: the batch dim's indexing and the dBias sum over it are the grid's (gqa_h4_hkv2, bias_h_1_nk)
    "gqa_causal_bias": _make((1, 4, 72, 32), (1, 2, 80, 32), (1, 2, 80, 32), bs=(4, 1, 80), causal=True),
}

GRID = {
    "odd_d25": _make((2, 2, 40, 25), (2, 2, 48, 25), (2, 2, 48, 25)),
    "dv40_ne_d32": _make((2, 2, 40, 32), (2, 2, 48, 32), (2, 2, 48, 40)),
    "d8": _make((2, 2, 40, 8), (2, 2, 48, 8), (2, 2, 48, 8)),
    "gqa_h4_hkv2": _make((2, 4, 40, 32), (2, 2, 48, 32), (2, 2, 48, 32)),
    "mqa_h4_hkv1": _make((2, 4, 40, 32), (2, 1, 48, 32), (2, 1, 48, 32)),
    "pma_q_batch1": _make((1, 2, 16, 32), (3, 2, 70, 32), (3, 2, 70, 32)),
    "q_no_batch": _make((2, 16, 32), (3, 2, 70, 32), (3, 2, 70, 32)),
    "bias_nq_nk": _make((2, 2, 40, 32), (2, 2, 48, 32), (2, 2, 48, 32), bs=(40, 48)),
    "bias_h_1_nk": _make((2, 2, 40, 32), (2, 2, 48, 32), (2, 2, 48, 32), bs=(2, 1, 48)),
    "bias_full": _make((2, 2, 40, 32), (2, 2, 48, 32), (2, 2, 48, 32), bs=(2, 2, 40, 48)),
    "causal_nq40_nk100": _make((2, 2, 40, 32), (2, 2, 100, 32), (2, 2, 100, 32), causal=True),
    "causal_nq100_nk40": _make((2, 2, 100, 32), (2, 2, 40, 32), (2, 2, 40, 32), causal=True),
    "causal_bias_bcast": _make((2, 2, 100, 32), (2, 2, 40, 32), (2, 2, 40, 32), bs=(100, 40), causal=True),
    "nq1": _make((2, 2, 1, 32), (2, 2, 70, 32), (2, 2, 70, 32), bs=(2, 2, 1, 70)),
    "nk1": _make((2, 2, 70, 32), (2, 2, 1, 32), (2, 2, 1, 32), bs=(2, 2, 70, 1)),
    "nk1_causal": _make((2, 2, 70, 32), (2, 2, 1, 32), (2, 2, 1, 32), causal=True),
    # Broadcast patterns that cannot be flattened into one batch dim by a view (a copy/sum path).
    "q_batch2d_partial": _make((2, 1, 2, 16, 32), (2, 3, 2, 24, 32), (2, 3, 2, 24, 32)),
    "bias_batch2d_partial": _make((2, 3, 2, 16, 32), (2, 3, 2, 24, 32), (2, 3, 2, 24, 32), bs=(2, 1, 2, 16, 24)),
    "non_contiguous": _non_contiguous,
    "len130_d64": _make((1, 2, 130, 64), (1, 2, 130, 64), (1, 2, 130, 64)),
    "len130_d64_causal": _make((1, 2, 130, 64), (1, 2, 130, 64), (1, 2, 130, 64), causal=True),
}


def _eager_grads(q, k, v, bias, dout, bias_grad, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    b = bias.detach().clone().requires_grad_(bias_grad) if bias is not None else None
    out = eager_gdpa(*leaves, b, **kw)
    wrt = leaves + ([b] if bias_grad else [])
    return out.detach(), torch.autograd.grad(out, wrt, dout)


def check_fwd_bwd(q, k, v, bias, causal, activation, gen, *, bias_grad=True, fwd_config=None, bwd_configs=None):
    dtype = q.dtype
    bias_grad = bias_grad and bias is not None
    kw = dict(activation=activation, scale=default_scale(q.shape[-1]), post_scale=0.75, causal=causal,
              negative_slope=0.2)
    half = dtype == torch.float16

    out = gdpa_fwd_triton(q, k, v, bias, config=fwd_config, **kw)
    ref = reference64(q, k, v, bias, **kw)
    assert out.shape == ref.shape and out.dtype == v.dtype and out.is_contiguous()
    dout = randn(gen, *out.shape, dtype=dtype)
    eager_out, eager_grads = _eager_grads(q, k, v, bias, dout, bias_grad, **kw) if half else (None, [None] * 4)
    assert_close_to_reference(out, ref, dtype=dtype, eager=eager_out, what="out")

    grads = gdpa_bwd_triton(dout, q, k, v, bias, bias_requires_grad=bias_grad, configs=bwd_configs, **kw)
    ref_grads = gdpa_reference_backward(
        *(t.to(F64) if t is not None else None for t in (dout, q, k, v, bias)), bias_requires_grad=bias_grad, **kw
    )
    if not bias_grad:
        assert grads[3] is None
    inputs = (q, k, v, bias)
    for i, name in enumerate(("dq", "dk", "dv", "dbias")[: 4 if bias_grad else 3]):
        g = grads[i]
        assert g.shape == inputs[i].shape and g.dtype == dtype and g.is_contiguous(), name
        assert_close_to_reference(g, ref_grads[i], dtype=dtype, eager=eager_grads[i], what=name)


@pytest.mark.parametrize("case", REPRESENTATIVE)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_every_activation(activation, dtype, case, gen):
    check_fwd_bwd(*REPRESENTATIVE[case](gen, dtype), activation, gen)


# Each shape in each dtype with one of GRID_ACTIVATIONS, in turn: the indexing, masks and broadcasts a shape tests do
# not depend on the activation (test_every_activation runs each one through the masked and unmasked tiles, with a
# bias and its gradient), and each activation still meets a third of the shapes in each dtype.
GRID_PARAMS = [
    pytest.param(activation, dtype, case, id=f"{activation}-{dtype_id(dtype)}-{case}")
    for i, case in enumerate(GRID)
    for j, dtype in enumerate(DTYPES)
    for activation in [GRID_ACTIVATIONS[(i + j) % len(GRID_ACTIVATIONS)]]
]


@pytest.mark.parametrize("activation, dtype, case", GRID_PARAMS)
def test_shape_grid(activation, dtype, case, gen):
    check_fwd_bwd(*GRID[case](gen, dtype), activation, gen)


# Tiles much smaller than the sequences, so that the causal split into unmasked tiles, the masked diagonal
# band, fully skipped tiles and ragged last tiles all occur several times per row and column.
SMALL_TILES = dict(
    fwd_config=FwdConfig(block_m=16, block_n=16, num_warps=4, num_stages=1),
    bwd_configs=(BwdConfig(16, 32, 4, 1), BwdConfig(32, 16, 4, 1)),
)


@pytest.mark.parametrize(
    "nq, nk", [(40, 100), (100, 40), (70, 70)], ids=["nq40_nk100", "nq100_nk40", "nq70_nk70"]
)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_causal_small_tiles(dtype, nq, nk, gen):
    q, k, v, _, _ = _make((1, 2, nq, 32), (1, 2, nk, 32), (1, 2, nk, 24))(gen, dtype)
    check_fwd_bwd(q, k, v, None, True, "gelu", gen, **SMALL_TILES)


@pytest.mark.parametrize(
    "nq, nk", [(40, 100), (100, 40), (140, 140)], ids=["nq40_nk100", "nq100_nk40", "nq140_nk140"]
)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_causal_full_bias_grad(dtype, nq, nk, gen):
    """dBias of a full-shape bias under a causal mask: entries the mask removes must get 0, including those
    in tiles the backward skips entirely."""
    q, k, v, bias, _ = _make((1, 2, nq, 32), (1, 2, nk, 32), (1, 2, nk, 32), bs=(1, 2, nq, nk))(gen, dtype)
    check_fwd_bwd(q, k, v, bias, True, "silu", gen)


@pytest.mark.parametrize("broadcast", ["key", "value"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_only_one_of_key_value_broadcast(dtype, broadcast, gen):
    """Key shared over the batch while value is per sample (or the reverse): the broadcast one's gradient
    is summed over the batch, the other one's is per sample."""
    kb, vb = (1, 3) if broadcast == "key" else (3, 1)
    q, k, v, _, _ = _make((3, 2, 40, 32), (kb, 2, 48, 32), (vb, 2, 48, 32))(gen, dtype)
    check_fwd_bwd(q, k, v, None, False, "silu", gen)


def test_gelu_with_additive_mask_bias_fp16(gen):
    """Models mask before GELU by adding -finfo.max (gelu(-65504) is exactly -0.0 in eager): the masked
    keys must contribute nothing, in the forward and in every gradient."""
    dtype = torch.float16
    q, k, v, _, _ = _make((2, 2, 48, 32), (2, 2, 64, 32), (2, 2, 64, 32))(gen, dtype)
    keep = torch.rand(48, 64, generator=gen) < 0.5
    bias = torch.zeros(48, 64, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    check_fwd_bwd(q, k, v, bias, False, "gelu", gen, bias_grad=False)


# numpy warns about the inf - inf it is asked to compute.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("activation", ["sigmoid", "identity"])
def test_inf_in_query_matches_reference(activation, dtype, gen):
    """An inf in a query row: sigmoid maps the +-inf scores to 0/1, so eager's output row stays finite;
    identity turns it into inf - inf = NaN. The kernel must give the same NaN/finite pattern, with a key
    length that leaves a ragged last key tile."""
    q, k, v, _, _ = _make((1, 2, 24, 16), (1, 2, 70, 16), (1, 2, 70, 16))(gen, dtype)
    q[0, 1, 5, 3] = float("inf")
    kw = dict(activation=activation, scale=0.25, post_scale=1.0, causal=False, negative_slope=0.01)
    out = gdpa_fwd_triton(q, k, v, None, **kw)
    ref = reference64(q, k, v, None, **kw)
    _assert_same_nonfinite_pattern(out, ref)


def _nan_rows(t):
    return t.isnan().any(-1).nonzero().tolist()


def _assert_same_nonfinite_pattern(out, ref):
    same_nan = torch.equal(out.isnan(), ref.isnan())
    assert same_nan, f"NaN rows {_nan_rows(out)}, reference {_nan_rows(ref)}"
    same_finite = torch.equal(out.isfinite(), ref.isfinite())
    assert same_finite, "inf entries differ from the reference"


@pytest.mark.parametrize("activation", ["gelu", "silu", "relu"])
def test_nan_in_query_poisons_exactly_its_rows(activation, gen):
    q, k, v, _, _ = _make((1, 2, 24, 16), (1, 2, 70, 16), (1, 2, 70, 16))(gen, torch.float32)
    q[0, 0, 7, 2] = float("nan")
    kw = dict(activation=activation, scale=0.25, post_scale=1.0, causal=True, negative_slope=0.01)
    out = gdpa_fwd_triton(q, k, v, None, **kw)
    ref = reference64(q, k, v, None, **kw)
    assert ref.isnan().any()
    _assert_same_nonfinite_pattern(out, ref)
