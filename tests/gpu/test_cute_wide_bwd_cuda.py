"""GPU correctness of the CuTe-DSL wide-head backward (``GdpaBwdWideSm90``: D or Dv of 256; skipped without an
sm_90 GPU and nvidia-cutlass-dsl).

Through the op's autograd with ``config.backend = "cute"`` (the wide-head forward, then this backward): dq, dk and
dv against float64, each within 2x of eager PyTorch's own error in the same dtype at the same inputs, over every
activation, ragged lengths (the masked last key and query tiles), GQA, fp16 and bf16, every head-dim pair the
kernel takes with 256 (dQ in one or two chunks a warpgroup), exact tiles (the unmasked loop alone), many CTAs,
1x17 and 17x2048; dQ summed each way the launcher can choose (in place over at most eight 64-key tiles, fp32
past them); the varlen op's layouts through the same kernel; and non-finite inputs as eager's pattern.
"""

from __future__ import annotations

import pytest
import torch
from varlen_testing import make_case

from gdpa_inductor.kernels.cute.bwd_plan import DQ_DIRECT_MAX_KEY_TILES, WIDE_KEY_TILE, dq_sums_for
from gdpa_inductor.kernels.cute.fwd_support import SUPPORTED_ACTIVATIONS
from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference_backward

from .cute_common import (
    FLOOR,
    NEEDS_CUTE,
    assert_backward_case_within_eager,
    assert_nonfinite_like_eager,
    dense_bwd_plan,
    eager_grads,
    rel_error,
)
from .varlen_common import check

pytestmark = NEEDS_CUTE

# (dtype, activation, Z, H, Hkv, Nq, Nk, D, Dv)
CASES = [("bf16", act, 2, 4, 4, 300, 300, 256, 256) for act in SUPPORTED_ACTIVATIONS] + [
    ("fp16", "gelu_tanh", 2, 4, 4, 257, 129, 256, 256),
    ("bf16", "silu", 2, 8, 2, 128, 1000, 256, 256),
    ("bf16", "gelu_tanh", 2, 4, 4, 300, 200, 256, 128),
    ("fp16", "sigmoid", 2, 4, 2, 200, 300, 128, 256),
    ("bf16", "relu", 2, 4, 4, 130, 260, 256, 64),
    ("bf16", "silu", 2, 4, 4, 260, 130, 64, 256),
    ("bf16", "gelu", 2, 4, 4, 100, 300, 96, 256),
    ("fp16", "relu_square", 2, 4, 4, 300, 100, 256, 96),
    ("bf16", "gelu_tanh", 2, 4, 4, 512, 512, 256, 256),
    ("bf16", "silu", 40, 4, 4, 512, 256, 256, 256),
    ("bf16", "silu", 3, 4, 4, 1, 17, 256, 256),
    ("bf16", "sigmoid", 1, 2, 2, 17, 2048, 256, 256),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_wide_backward_matches_float64(case, cute_backend):
    assert_backward_case_within_eager(case)


@pytest.mark.parametrize("nk", [512, 576, 1024])
@pytest.mark.parametrize("d, dv", [(256, 256), (128, 256)])
def test_dq_sums_each_within_eager_error(nk, d, dv):
    """dQ summed in place (up to one 64-key tile past the launcher's limit) and in fp32, each within 2x eager's
    error; dK and dV the same either way."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(2, 4, 300, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    do = torch.randn(2, 4, 300, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(2, 4, nk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(2, 4, nk, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale, post = d**-0.5, 1.0 / nk
    ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, "silu", scale, post)[0]
    base = rel_error(eager_grads(q, k, v, do, "silu", scale, post)[0], ref)
    tiles = -(-nk // WIDE_KEY_TILE)
    sums = ["fp32"] + ["in_place"] * (tiles <= DQ_DIRECT_MAX_KEY_TILES + 1)
    assert dq_sums_for(nk, WIDE_KEY_TILE) in sums
    grads = {how: gdpa_bwd_cute(q, k, v, do, "silu", scale, post, 0.01,
                                plan=dense_bwd_plan(q, k, v, "silu", dq_sums=how)) for how in sums}
    for how, (dq, *_) in grads.items():
        assert dq.dtype == torch.bfloat16
        assert rel_error(dq, ref) <= 2 * base + FLOOR, (how, rel_error(dq, ref), base)
    assert all(torch.equal(a, b) for a, b in zip(grads["fp32"][1:3], grads[sums[-1]][1:3]))


def test_nonfinite_like_eager_pattern(cute_backend):
    """A non-finite key reaches the gradients as in eager; padded queries and keys past the ends add nothing."""
    assert_nonfinite_like_eager(256)


LENGTHS = [300, 0, 1, 129, 17, 64, 700, 128]


@pytest.mark.parametrize("layout", ["self", "cross", "padded", "pma", "pffn"])
def test_varlen_layouts(layout, cute_varlen_only):
    """The varlen op at D = Dv = 256 on the CuTe kernels (the Triton varlen kernels fail the test)."""
    gen = torch.Generator().manual_seed(0)
    case = make_case(layout, gen, h=4, hkv=2, d=256, dv=256, lq=LENGTHS, lk=LENGTHS[::-1]).to("cuda")
    check(case, torch.bfloat16, activation="gelu_tanh")


@pytest.mark.parametrize("d, dv", [(256, 128), (64, 256)])
def test_varlen_head_dims(d, dv, cute_varlen_only):
    gen = torch.Generator().manual_seed(1)
    case = make_case("cross", gen, h=4, hkv=4, d=d, dv=dv, lq=LENGTHS, lk=LENGTHS[::-1]).to("cuda")
    check(case, torch.bfloat16, activation="silu")
