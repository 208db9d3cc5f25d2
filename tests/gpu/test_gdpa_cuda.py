"""GPU correctness of the Triton kernels (skipped without CUDA; run on the lent H100/H200).

Standard: against a float64 reference, the fused op's relative error (forward and every gradient) is at
most 2x the error of eager PyTorch doing the same math in the same dtype, at the same shape and inputs.
The grid crosses every activation with bf16/fp16 and query/key lengths {1, 17, 128, 1000, 2048} at
D=128, then head dims {32, 64, 256} and odd/non-power-of-two {25, 72, 80} on a subset, then the features
(causal, bias with gradient, GQA, PMA broadcast, Dv != D, non-contiguous, fp32).
"""

from __future__ import annotations

import math

import pytest
import torch

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.activations import ACTIVATION_NAMES, get_activation
from gdpa_inductor.kernels.reference import causal_keep_mask, gdpa_reference
from gdpa_inductor.lowering.dispatch import select_impl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LENGTHS = (1, 17, 128, 1000, 2048)
# The op rounds its output (and P before the second matmul) to the input dtype, as eager does; the small
# floor covers cases where eager happens to be exact (e.g. a single key).
FLOOR = 1e-4


def _eager(q, k, v, bias, activation, scale, post_scale, causal, slope=0.01):
    """Eager PyTorch, same dtype: what the user's unfused model computes."""
    group = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(group, dim=-3)
    v = v.repeat_interleave(group, dim=-3)
    s = q @ k.transpose(-2, -1) * scale
    if bias is not None:
        s = s + bias
    p = get_activation(activation).torch_fn(s, slope) * post_scale
    if causal:
        p = p.masked_fill(~causal_keep_mask(q.shape[-2], k.shape[-2], q.device), 0)
    return p @ v


def _grads(fn, tensors, dout):
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, [t for t in leaves], dout)
    return out.detach(), grads


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(q, k, v, bias=None, *, activation, causal=False, scale=None, floor=FLOOR):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    post = 1.0 / k.shape[-2]
    assert select_impl(q, k, v, bias, "test") == "triton"
    tensors = [q, k, v] + ([bias] if bias is not None else [])
    batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3])
    dout = torch.randn(*batch, q.shape[-3], q.shape[-2], v.shape[-1], device=q.device, dtype=q.dtype)

    def fused(q, k, v, b=None):
        return gdpa(q, k, v, activation=activation, scale=scale, post_scale=post, bias=b, causal=causal)

    def ref(q, k, v, b=None):
        return gdpa_reference(q, k, v, b, activation, scale, post, causal)

    def eager(q, k, v, b=None):
        return _eager(q, k, v, b, activation, scale, post, causal)

    o_ref, g_ref = _grads(ref, [t.double() for t in tensors], dout.double())
    o_op, g_op = _grads(fused, tensors, dout)
    o_eg, g_eg = _grads(eager, tensors, dout)
    names = ["out", "dq", "dk", "dv", "dbias"]
    for name, x, e, r in zip(names, (o_op, *g_op), (o_eg, *g_eg), (o_ref, *g_ref)):
        assert x.dtype == e.dtype and x.shape == e.shape, name
        err, eager_err = _rel(x, r), _rel(e, r)
        assert err <= 2 * eager_err + floor, f"{name}: {err:.2e} > 2 x eager {eager_err:.2e}"


def _qkv(b, h, hkv, nq, nk, d, dv, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    return mk(b, h, nq, d), mk(b, hkv, nk, d), mk(b, hkv, nk, dv)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_every_activation_over_lengths(activation, dtype):
    for i, (nq, nk) in enumerate((a, b) for a in LENGTHS for b in LENGTHS):
        check(*_qkv(1, 2, 2, nq, nk, 128, 128, dtype, seed=i), activation=activation)


@pytest.fixture
def pointer_forward(monkeypatch):
    """The pointer forward kernel where Hopper would take the TMA one: what other GPUs run without a bias."""
    monkeypatch.setattr("gdpa_inductor.kernels.triton.tma_support.tma_supported", lambda *args: False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_pointer_forward_every_activation(activation, dtype, pointer_forward):
    for i, (nq, nk) in enumerate(((17, 1000), (300, 2048))):
        check(*_qkv(2, 2, 2, nq, nk, 128, 128, dtype, seed=i), activation=activation)
    check(*_qkv(2, 2, 2, 250, 250, 64, 64, dtype, seed=9), activation=activation, causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("d", [32, 64, 256, 25, 72, 80])
@pytest.mark.parametrize("activation", ["gelu", "silu", "sigmoid"])
def test_head_dims(activation, d, dtype):
    for i, (nq, nk) in enumerate([(1, 17), (17, 1000), (128, 128), (1000, 1), (2048, 2048)]):
        check(*_qkv(1, 2, 2, nq, nk, d, d, dtype, seed=i), activation=activation)


# fp32 errors are ~1e-7: the default floor would hide an approximate special function (tanh.approx's ~2^-11)
FP32_FLOOR = 1e-6


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_fp32_keeps_fp32_accuracy(activation):
    for i, (nq, nk) in enumerate(((128, 128), (300, 1000))):
        check(*_qkv(2, 2, 2, nq, nk, 64, 64, torch.float32, seed=i), activation=activation, floor=FP32_FLOOR)


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu", "relu_square", "leaky_relu"])
@pytest.mark.parametrize("nq,nk", [(128, 128), (1000, 2048), (2048, 1000), (17, 1)])
def test_causal(activation, nq, nk):
    check(*_qkv(2, 2, 2, nq, nk, 64, 64, torch.bfloat16, seed=nq + nk), activation=activation, causal=True)


@pytest.mark.parametrize("bias_shape", ["full", "heads", "keys"])
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_bias_with_grad(activation, bias_shape):
    q, k, v = _qkv(2, 4, 4, 300, 260, 64, 64, torch.bfloat16, seed=3)
    shape = {"full": (2, 4, 300, 260), "heads": (4, 300, 260), "keys": (2, 1, 1, 260)}[bias_shape]
    bias = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    check(q, k, v, bias, activation=activation, causal=bias_shape == "full")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_gqa_pma_dv_noncontiguous(dtype):
    # GQA 8 -> 2 heads with Dv != D
    check(*_qkv(3, 8, 2, 200, 333, 64, 128, dtype, seed=1), activation="gelu")
    # PMA: one block of seed queries serves every sample (batch-1 query, gradient summed over batch)
    q, k, v = _qkv(4, 4, 4, 16, 500, 128, 128, dtype, seed=2)
    check(q[:1], k, v, activation="silu")
    # non-contiguous: heads split from [B, N, H, D] and a strided key/value
    base = torch.randn(2, 300, 4, 64, device="cuda", dtype=dtype)
    kv = torch.randn(2, 4, 600, 64, device="cuda", dtype=dtype)
    check(base.transpose(1, 2), kv[:, :, ::2], kv[:, :, 1::2], activation="gelu_tanh")
