"""What the CuTe-DSL GPU tests share (their fixture ``cute_backend`` is in conftest.py): the skip marks, the
eager math, the relative error and the cases
(every activation at a ragged 300x300, fp16, GQA 8->2 and 4->1, D and Dv in {64, 96, 128}, equal and not, 1x17,
17x2048, and batches of more query tiles than SMs, where each CTA runs several tiles and the steps cross from one
tile to the next: key counts of one and two key tiles, ragged and exact)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.activations import get_activation
from gdpa_inductor.kernels.cute.bwd_plan import bwd_query_tile, dq_last_round_for
from gdpa_inductor.kernels.cute.fwd_support import SUPPORTED_ACTIVATIONS, cute_dsl_available, on_sm90
from gdpa_inductor.kernels.cute.gdpa_bwd import plan_dense_bwd
from gdpa_inductor.kernels.reference import gdpa_reference_backward
from gdpa_inductor.lowering.dispatch import select_backward_impl

NEEDS_CUTE = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and on_sm90(torch.device("cuda")) and cute_dsl_available()),
        reason="needs an sm_90 GPU and nvidia-cutlass-dsl",
    ),
]
# absolute slack under the 2x-eager bound, for errors near zero
FLOOR = 1e-4
# (dtype, activation, Z, H, Hkv, Nq, Nk, D, Dv)
CASES = [("bf16", act, 2, 4, 4, 300, 300, 128, 128) for act in SUPPORTED_ACTIVATIONS] + [
    ("fp16", "gelu_tanh", 2, 4, 4, 257, 129, 128, 128),
    ("bf16", "silu", 2, 8, 2, 128, 1000, 128, 128),
    ("bf16", "silu", 3, 4, 4, 1, 17, 64, 64),
    ("bf16", "gelu_tanh", 2, 4, 1, 2048, 2048, 64, 64),
    ("bf16", "sigmoid", 1, 2, 2, 17, 2048, 128, 128),
    ("bf16", "gelu_tanh", 40, 4, 4, 512, 256, 128, 128),
    ("bf16", "silu", 60, 4, 2, 200, 100, 128, 128),
    ("bf16", "relu", 40, 4, 4, 300, 200, 64, 64),
    ("bf16", "gelu_tanh", 300, 1, 1, 64, 128, 64, 64),
    ("fp16", "sigmoid", 30, 4, 4, 384, 640, 128, 128),
    # D = 96 and Dv != D: ragged, GQA, several tiles per CTA, fp16
    ("bf16", "gelu_tanh", 2, 4, 4, 300, 300, 96, 96),
    ("bf16", "silu", 40, 4, 4, 300, 200, 96, 96),
    ("bf16", "relu", 2, 8, 2, 257, 1000, 64, 128),
    ("bf16", "gelu_tanh", 30, 4, 4, 384, 640, 128, 64),
    ("fp16", "sigmoid", 2, 4, 4, 300, 129, 96, 128),
    ("bf16", "relu_square", 2, 4, 2, 200, 700, 128, 96),
    ("bf16", "hardswish", 3, 4, 4, 130, 300, 64, 96),
    ("bf16", "gelu", 2, 4, 2, 300, 260, 96, 64),
]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def dense_bwd_plan(q, k, v, activation, causal=False, bias=None, bias_grad=False, dq_sums=None, **fields):
    """The dense backward's plan of this call (``plan_dense_bwd``) with dQ summed as ``dq_sums`` says (None: the
    launcher's way), its query tile and dQ's last round then as the launcher takes them for that way, and
    ``fields`` replaced (a query tile, a last round, the atomic dbias sums)."""
    plan = plan_dense_bwd(q, k, v, activation, causal, bias, bias_grad)
    if dq_sums is not None:
        d, dv = q.shape[-1], v.shape[-1]
        query_tile = bwd_query_tile(dq_sums, d, dv, causal, plan.score_bias, activation, q.shape[2], plan.packed)
        plan = dataclasses.replace(plan, dq_sums=dq_sums, query_tile=query_tile,
                                   dq_last_round=dq_last_round_for(dq_sums, d, dv))
    return dataclasses.replace(plan, **fields)


def bwd_inputs(z, h, hkv, nq, nk, d, dv, dtype, seed):
    """Random (q, k, v, dO) on the GPU for a backward case: [Z, H or Hkv, N, D or Dv]."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(z, h, nq, d, device="cuda", dtype=dtype, generator=gen)
    do = torch.randn(z, h, nq, dv, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(z, hkv, nk, dv, device="cuda", dtype=dtype, generator=gen)
    return q, k, v, do


def eager_gdpa(q, k, v, activation, scale, post_scale):
    """The math as plain torch ops in the inputs' dtype (eager's own error is the bound), GQA by repeat."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    return get_activation(activation).torch_fn(q @ k.transpose(-2, -1) * scale, 0.01) * post_scale @ v


def autograd_grads(forward, q, k, v, do, *args):
    """(dq, dk, dv) of ``forward(q, k, v, *args)`` against ``do``, by autograd on fresh leaves."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    forward(q, k, v, *args).backward(do)
    return q.grad, k.grad, v.grad


def assert_grads_within_eager(grads, refs, eager, dtype):
    """Each of (dq, dk, dv) in ``dtype`` and the reference's shape, within 2x eager's own error against it."""
    for name, got, ref, base in zip(("dq", "dk", "dv"), grads, refs, eager):
        assert got.dtype == dtype and got.shape == ref.shape, name
        err, bound = rel_error(got, ref), rel_error(base, ref)
        assert err <= 2 * bound + FLOOR, (name, err, bound)


def rel_error(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def eager_grads(q, k, v, do, activation, scale, post_scale):
    """(dq, dk, dv) of the math as plain torch ops in the inputs' dtype."""
    return autograd_grads(eager_gdpa, q, k, v, do, activation, scale, post_scale)


def assert_backward_case_within_eager(case):
    """A backward case (dtype, activation, Z, H, Hkv, Nq, Nk, D, Dv) through the op's autograd on the CuTe
    kernels (the caller forces them): dq, dk and dv within 2x eager's error against float64."""
    dtype_name, act, z, h, hkv, nq, nk, d, dv = case
    dtype = DTYPES[dtype_name]
    q, k, v, do = bwd_inputs(z, h, hkv, nq, nk, d, dv, dtype, 2)
    scale, post = d**-0.5, 1.0 / nk
    assert select_backward_impl(q, k, v, None, False, act) == "cute"
    refs = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, act, scale, post)[:3]
    grads = autograd_grads(lambda *qkv: gdpa(*qkv, activation=act, scale=scale, post_scale=post), q, k, v, do)
    assert_grads_within_eager(grads, refs, eager_grads(q, k, v, do, act, scale, post), dtype)


def assert_nonfinite_like_eager(d):
    """A non-finite key at head dim ``d`` reaches the op's gradients as in eager (the caller forces the CuTe
    kernels): padded queries and keys past the ends add nothing, not NaN."""
    q, do = (torch.randn(1, 2, 130, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 2, 200, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k[0, 1, 7, 3] = float("inf")
    qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
    gdpa(qa, ka, va, activation="sigmoid").backward(do)
    eager = eager_grads(q, k, v, do, "sigmoid", 1.0, 1.0)
    for got, expected in zip((qa.grad, ka.grad, va.grad), eager):
        assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
