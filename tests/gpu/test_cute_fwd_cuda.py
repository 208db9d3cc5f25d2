"""GPU correctness of the CuTe-DSL Hopper forward (skipped without an sm_90 GPU and nvidia-cutlass-dsl;
on the lent H200 cutlass-dsl is staged with ../shared/device/stage-cute-dsl.sh).

Against a float64 reference, the CuTe forward's relative error is at most 2x eager PyTorch's own error in
the same dtype at the same inputs, over every activation, ragged lengths (TMA's zero fill plus the last key
tile's mask), GQA, D in {64, 128}, fp16 and bf16, through the op with ``config.backend = "cute"``.
"""

from __future__ import annotations

import pytest
import torch

import gdpa_inductor
from gdpa_inductor import gdpa
from gdpa_inductor.kernels.activations import get_activation
from gdpa_inductor.kernels.cute.gdpa_fwd import SUPPORTED_ACTIVATIONS, cute_dsl_available, on_sm90
from gdpa_inductor.kernels.reference import gdpa_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and on_sm90(torch.device("cuda")) and cute_dsl_available()),
        reason="needs an sm_90 GPU and nvidia-cutlass-dsl",
    ),
]
FLOOR = 1e-4


@pytest.fixture
def cute_backend():
    saved = gdpa_inductor.config.backend
    gdpa_inductor.config.backend = "cute"
    yield
    gdpa_inductor.config.backend = saved


def _eager(q, k, v, activation, scale, post_scale):
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    return get_activation(activation).torch_fn(q @ k.transpose(-2, -1) * scale, 0.01) * post_scale @ v


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


CASES = [("bf16", act, 2, 4, 4, 300, 300, 128) for act in SUPPORTED_ACTIVATIONS] + [
    ("fp16", "gelu_tanh", 2, 4, 4, 257, 129, 128),
    ("bf16", "silu", 2, 8, 2, 128, 1000, 128),
    ("bf16", "silu", 3, 4, 4, 1, 17, 64),
    ("bf16", "gelu_tanh", 2, 4, 1, 2048, 2048, 64),
    ("bf16", "sigmoid", 1, 2, 2, 17, 2048, 128),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_cute_forward_matches_float64(case, cute_backend):
    dtype_name, act, z, h, hkv, nq, nk, d = case
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(z, h, nq, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype, generator=gen)
    scale, post = d**-0.5, 1.0 / nk
    ref = gdpa_reference(q.double(), k.double(), v.double(), None, act, scale, post)
    out = gdpa(q, k, v, activation=act, scale=scale, post_scale=post)
    assert out.dtype == dtype and out.shape == (z, h, nq, d)
    assert _rel(out, ref) <= 2 * _rel(_eager(q, k, v, act, scale, post), ref) + FLOOR


def test_cute_forward_nonfinite_like_eager_pattern(cute_backend):
    """A non-finite query spreads over its row only: padded keys past Nk add nothing, not NaN."""
    q = torch.randn(1, 2, 130, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 200, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q[0, 0, 3, 5] = float("inf")
    out = gdpa(q, k, v, activation="relu")
    expected = _eager(q, k, v, "relu", 1.0, 1.0)
    assert torch.equal(out.isnan(), expected.isnan()) and torch.equal(out.isinf(), expected.isinf())
