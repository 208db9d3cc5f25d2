"""GPU correctness of the CuTe-DSL Hopper forward (skipped without an sm_90 GPU and nvidia-cutlass-dsl;
on the lent H200 cutlass-dsl is staged with ../shared/device/stage-cute-dsl.sh).

Against a float64 reference, the CuTe forward's relative error is at most 2x eager PyTorch's own error in
the same dtype at the same inputs, over every activation, ragged lengths (TMA's zero fill plus the last key
tile's mask), GQA, D in {64, 128}, fp16 and bf16, through the op with ``config.backend = "cute"``.
"""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor import gdpa
from gdpa_inductor.kernels.reference import gdpa_reference

from .cute_common import CASES, DTYPES, FLOOR, NEEDS_CUTE, eager_gdpa, rel_error

pytestmark = NEEDS_CUTE



@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_cute_forward_matches_float64(case, cute_backend):
    dtype_name, act, z, h, hkv, nq, nk, d = case
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(z, h, nq, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype, generator=gen)
    scale, post = d**-0.5, 1.0 / nk
    ref = gdpa_reference(q.double(), k.double(), v.double(), None, act, scale, post)
    out = gdpa(q, k, v, activation=act, scale=scale, post_scale=post)
    assert out.dtype == dtype and out.shape == (z, h, nq, d)
    assert rel_error(out, ref) <= 2 * rel_error(eager_gdpa(q, k, v, act, scale, post), ref) + FLOOR


def test_cute_forward_nonfinite_like_eager_pattern(cute_backend):
    """A non-finite query spreads over its row only: padded keys past Nk add nothing, not NaN."""
    q = torch.randn(1, 2, 130, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 200, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q[0, 0, 3, 5] = float("inf")
    out = gdpa(q, k, v, activation="relu")
    expected = eager_gdpa(q, k, v, "relu", 1.0, 1.0)
    assert torch.equal(out.isnan(), expected.isnan()) and torch.equal(out.isinf(), expected.isinf())
