"""GPU correctness of the CuTe-DSL Hopper kernels with a one-element bias (sigmoid attention's -log n, a constant
over the scores; skipped without an sm_90 GPU and nvidia-cutlass-dsl): through the op with the CuTe kernels forced,
the output and dq, dk, dv against float64, each within 2x eager's own error, over activations (bf16's packed forms
and the fp32 forms), ragged and exact key counts, D=64, D or Dv of 256 (the wide-head kernels), the causal mask,
fp16, GQA, positive and negative biases, scale 0; a bias that wants its gradient takes the CuTe forward and the usual
backward under "auto"; non-finite biases give eager's NaN/Inf pattern; the backend's rewrite of sigmoid attention
with its -log n reaches the CuTe kernels."""

from __future__ import annotations

import math

import pytest
import torch

import gdpa_inductor
from gdpa_inductor import gdpa
from gdpa_inductor.kernels.activations import get_activation
from gdpa_inductor.kernels.cute import gdpa_bwd as cute_bwd
from gdpa_inductor.kernels.cute import gdpa_fwd as cute_fwd
from gdpa_inductor.kernels.reference import band_keep_mask, gdpa_reference, gdpa_reference_backward
from gdpa_inductor.lowering import dispatch

from .cute_common import DTYPES, FLOOR, NEEDS_CUTE, assert_grads_within_eager, autograd_grads, bwd_inputs, rel_error

pytestmark = NEEDS_CUTE

# (dtype, activation, Z, H, Hkv, Nq, Nk, D, Dv, bias, causal)
BIAS_CASES = [
    ("bf16", "sigmoid", 2, 4, 4, 300, 300, 128, 128, -math.log(300), False),
    ("bf16", "gelu_tanh", 2, 4, 4, 257, 384, 128, 128, -1.5, False),
    ("bf16", "silu", 2, 8, 2, 128, 1000, 128, 128, 0.75, False),
    ("bf16", "relu", 40, 4, 4, 300, 200, 64, 64, 0.3, False),
    ("fp16", "sigmoid", 30, 4, 4, 384, 640, 128, 128, -math.log(640), False),
    ("bf16", "gelu", 2, 4, 2, 300, 260, 96, 64, -0.5, False),
    ("bf16", "hardswish", 3, 4, 4, 130, 300, 64, 96, 1.0, False),
    ("bf16", "leaky_relu", 2, 4, 4, 200, 700, 128, 96, -2.0, False),
    ("bf16", "relu_square", 2, 4, 4, 128, 256, 128, 128, -0.25, False),
    ("bf16", "identity", 1, 4, 4, 64, 129, 128, 128, 3.0, False),
    ("bf16", "sigmoid", 2, 4, 4, 300, 1324, 128, 128, -math.log(1324), True),
    ("fp16", "silu", 2, 4, 2, 257, 385, 128, 128, -1.0, True),
    ("bf16", "gelu_tanh", 2, 4, 4, 1100, 1100, 256, 256, -1.0, False),
    ("bf16", "sigmoid", 2, 4, 2, 300, 1200, 128, 256, -math.log(1200), False),
]


def eager_biased(q, k, v, activation, scale, post_scale, bias, causal):
    """The math as plain torch ops in the inputs' dtype: S + bias before the activation, masked scores P = 0."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    p = get_activation(activation).torch_fn(q @ k.transpose(-2, -1) * scale + bias, 0.01)
    if causal:
        p = p.masked_fill(~band_keep_mask(q.shape[-2], k.shape[-2], True, (-1, -1), q.device), 0)
    return p * post_scale @ v


def _op(activation, scale, post_scale, bias, causal):
    return lambda q, k, v: gdpa(q, k, v, activation=activation, scale=scale, post_scale=post_scale, bias=bias,
                                causal=causal)


@pytest.mark.parametrize("case", BIAS_CASES, ids=lambda c: "-".join(f"{x:.3g}" if isinstance(x, float) else str(x)
                                                                   for x in c))
def test_bias_forward_and_backward_match_float64(case, cute_backend):
    dtype_name, act, z, h, hkv, nq, nk, d, dv, value, causal = case
    dtype = DTYPES[dtype_name]
    q, k, v, do = bwd_inputs(z, h, hkv, nq, nk, d, dv, dtype, 5)
    bias = torch.tensor(value, dtype=dtype, device="cuda")
    scale, post = d**-0.5, 1.0 / nk
    assert dispatch.select_forward_impl(q, k, v, bias, causal, act) == "cute"
    assert dispatch.select_backward_impl(q, k, v, bias, causal, act) == "cute"
    qd, kd, vd, bd = (t.double() for t in (q, k, v, bias))
    ref = gdpa_reference(qd, kd, vd, bd, act, scale, post, causal)
    out = gdpa(q, k, v, activation=act, scale=scale, post_scale=post, bias=bias, causal=causal)
    eager = eager_biased(q, k, v, act, scale, post, bias, causal)
    assert rel_error(out, ref) <= 2 * rel_error(eager, ref) + FLOOR, (rel_error(out, ref), rel_error(eager, ref))
    refs = gdpa_reference_backward(do.double(), qd, kd, vd, bd, act, scale, post, causal=causal)[:3]
    grads = autograd_grads(_op(act, scale, post, bias, causal), q, k, v, do)
    eager_grads = autograd_grads(lambda *qkv: eager_biased(*qkv, act, scale, post, bias, causal), q, k, v, do)
    assert_grads_within_eager(grads, refs, eager_grads, dtype)


def test_bias_shifts_the_scores_not_the_output(cute_backend):
    """The bias enters before the activation: relu with a bias below every score gives zeros, with one above
    every score the unbiased output plus bias · post_scale · the column sums of V."""
    q, k, v, _ = bwd_inputs(2, 4, 4, 200, 300, 128, 128, torch.bfloat16, 7)
    scale = 128**-0.5
    scores = (q.float() @ k.float().transpose(-2, -1) * scale).abs().max().item()
    low = torch.tensor(-2 * scores, dtype=torch.bfloat16, device="cuda")
    assert gdpa(q, k, v, activation="relu", scale=scale, bias=low).abs().max().item() == 0.0
    high = torch.tensor(2 * scores, dtype=torch.bfloat16, device="cuda")
    out = gdpa(q, k, v, activation="relu", scale=scale, bias=high)
    shifted = gdpa_reference(*(t.double() for t in (q, k, v)), None, "identity", scale) + high.double() * (
        v.double().sum(-2, keepdim=True))
    assert rel_error(out, shifted) < 1e-2


@pytest.mark.parametrize("act", ["sigmoid", "gelu_tanh", "relu"])
def test_bias_at_scale_zero(act, cute_backend):
    """At scale 0 every score is act(bias) (the bias is the first product's addend, not divided by the scale): the
    output and dv within 2x eager's error against float64, dq and dk exactly zero."""
    q, k, v, do = bwd_inputs(2, 4, 4, 200, 300, 128, 128, torch.bfloat16, 9)
    bias = torch.tensor(0.7, dtype=torch.bfloat16, device="cuda")
    post = 1.0 / 300
    assert dispatch.select_forward_impl(q, k, v, bias, False, act) == "cute"
    assert dispatch.select_backward_impl(q, k, v, bias, False, act) == "cute"
    qd, kd, vd, bd = (t.double() for t in (q, k, v, bias))
    ref = gdpa_reference(qd, kd, vd, bd, act, 0.0, post)
    out = gdpa(q, k, v, activation=act, scale=0.0, post_scale=post, bias=bias)
    eager = eager_biased(q, k, v, act, 0.0, post, bias, False)
    assert rel_error(out, ref) <= 2 * rel_error(eager, ref) + FLOOR, (rel_error(out, ref), rel_error(eager, ref))
    dq, dk, dv = autograd_grads(_op(act, 0.0, post, bias, False), q, k, v, do)
    assert not dq.any() and not dk.any()
    ref_dv = gdpa_reference_backward(do.double(), qd, kd, vd, bd, act, 0.0, post)[2]
    eager_dv = autograd_grads(lambda *qkv: eager_biased(*qkv, act, 0.0, post, bias, False), q, k, v, do)[2]
    assert rel_error(dv, ref_dv) <= 2 * rel_error(eager_dv, ref_dv) + FLOOR


@pytest.mark.parametrize("value", [-1.25, -math.log(384)])
def test_bias_gradient_takes_the_usual_backward(backend, value):
    """Under "auto" a bias that wants its gradient runs the CuTe forward and the backward that computes dbias
    (Triton's): every gradient, dbias included, within 2x eager's error against float64, sigmoid's saturated range
    (-log n) included."""
    backend("auto")
    q, k, v, do = bwd_inputs(2, 4, 4, 300, 384, 128, 128, torch.bfloat16, 3)
    scale, post = 128**-0.5, 1.0 / 384
    bias = torch.tensor(value, dtype=torch.bfloat16, device="cuda")
    assert dispatch.select_forward_impl(q, k, v, bias, False, "sigmoid") == "cute"
    assert dispatch.select_backward_impl(q, k, v, bias, False, "sigmoid", bias_grad=True) == "triton"
    leaves = [t.detach().requires_grad_() for t in (q, k, v, bias)]
    gdpa(*leaves[:3], activation="sigmoid", scale=scale, post_scale=post, bias=leaves[3]).backward(do)
    eager_leaves = [t.detach().requires_grad_() for t in (q, k, v, bias)]
    eager_biased(*eager_leaves[:3], "sigmoid", scale, post, eager_leaves[3], False).backward(do)
    qd, kd, vd, bd = (t.double() for t in (q, k, v, bias))
    refs = gdpa_reference_backward(do.double(), qd, kd, vd, bd, "sigmoid", scale, post, bias_requires_grad=True)
    for name, got, ref, base in zip(("dq", "dk", "dv", "dbias"), leaves, refs, eager_leaves):
        err, bound = rel_error(got.grad, ref.reshape(got.shape)), rel_error(base.grad, ref.reshape(got.shape))
        assert err <= 2 * bound + FLOOR, (name, err, bound)


@pytest.fixture
def backend():
    saved = gdpa_inductor.config.backend

    def set_backend(name):
        gdpa_inductor.config.backend = name

    yield set_backend
    gdpa_inductor.config.backend = saved


@pytest.mark.parametrize("act, value", [("sigmoid", float("inf")), ("silu", float("-inf")), ("gelu_tanh", float("nan")),
                                        ("relu", float("-inf"))])
def test_nonfinite_bias_like_eager(act, value, cute_backend):
    q, k, v, do = bwd_inputs(1, 2, 2, 130, 200, 128, 128, torch.bfloat16, 11)
    bias = torch.tensor(value, dtype=torch.bfloat16, device="cuda")
    got = [gdpa(q, k, v, activation=act, bias=bias)]
    got += autograd_grads(_op(act, 1.0, 1.0, bias, False), q, k, v, do)
    expected = [eager_biased(q, k, v, act, 1.0, 1.0, bias, False)]
    expected += autograd_grads(lambda *qkv: eager_biased(*qkv, act, 1.0, 1.0, bias, False), q, k, v, do)
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected):
        assert torch.equal(g.isnan(), e.isnan()) and torch.equal(g.isinf(), e.isinf()), name


class _SigmoidAttention(torch.nn.Module):
    """Sigmoid attention as written in the field: sigmoid(q kᵀ / sqrt(d) - log n) v."""

    def forward(self, q, k, v):
        n = k.shape[-2]
        return torch.sigmoid(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - math.log(n)) @ v


def test_backend_rewrite_of_log_n_bias_runs_cute(monkeypatch):
    """torch.compile(backend="gdpa") turns sigmoid attention's -log n into the op's 0-d bias, and "auto" runs the
    CuTe forward and backward on it: output and gradients within 2x eager's error against float64. The graph takes
    the opaque op's CuTe path at any size here (at this one it would launch Triton itself: CuTe saves less GPU time
    than the op's host time)."""
    from gdpa_inductor.lowering import direct_launch

    monkeypatch.setattr(direct_launch, "OPAQUE_CALL_HOST_S", 0.0)
    calls = {"fwd": 0, "bwd": 0}
    fwd, bwd = cute_fwd.gdpa_fwd_cute_op, cute_bwd.gdpa_bwd_cute_op

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(cute_fwd, "gdpa_fwd_cute_op", counting("fwd", fwd))
    monkeypatch.setattr(cute_bwd, "gdpa_bwd_cute_op", counting("bwd", bwd))
    q, k, v, do = bwd_inputs(4, 4, 4, 512, 512, 128, 128, torch.bfloat16, 13)
    torch._dynamo.reset()
    model = torch.compile(_SigmoidAttention(), backend="gdpa")
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = model(*leaves)
    out.backward(do)
    assert calls == {"fwd": 1, "bwd": 1}, calls
    qd, kd, vd = (t.double() for t in (q, k, v))
    bias = torch.tensor(-math.log(512), dtype=torch.float64, device="cuda")
    ref = gdpa_reference(qd, kd, vd, bias, "sigmoid", 128**-0.5)
    eager_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    eager = _SigmoidAttention()(*eager_leaves)
    eager.backward(do)
    assert rel_error(out, ref) <= 2 * rel_error(eager, ref) + FLOOR
    refs = gdpa_reference_backward(do.double(), qd, kd, vd, bias, "sigmoid", 128**-0.5)[:3]
    assert_grads_within_eager([t.grad for t in leaves], refs, [t.grad for t in eager_leaves], torch.bfloat16)
