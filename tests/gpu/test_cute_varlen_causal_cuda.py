"""GPU correctness of the CuTe-DSL varlen forward and backward under the causal mask (skipped without an sm_90 GPU
and nvidia-cutlass-dsl).

The causal calls they take (``varlen_causal_support``): jagged self-attention with one cu_seqlens tensor for both
sides (HSTU's case), a padded batch with one seqused tensor, and full dense sides whose lengths differ by a multiple
of 128 keys. Against the float64 oracle of tests/varlen_testing.py (the mask by explicit index comparison), the
forward and every gradient are within 2x of the oracle's math in the same dtype, over ragged, empty, single-token
and many-tile samples, every activation, bf16 and fp16, GQA, head dims of 64 to 128, and batches whose longest
sample has at most eight key tiles (dQ summed in place) or more (fp32). The Triton varlen kernels are made to fail,
so each case proves the CuTe kernels ran. Non-finite values in one sample leave every other sample's output and
gradients unchanged to the bit.
"""

from __future__ import annotations

import pytest
import torch
from varlen_testing import make_case

from gdpa_inductor.kernels.cute.fwd_support import SUPPORTED_ACTIVATIONS

from .cute_common import NEEDS_CUTE
from .varlen_common import assert_poison_stays_in_its_sample, check, dense_case

pytestmark = NEEDS_CUTE

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LENGTHS = [300, 0, 1, 129, 17, 64, 256, 128]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(31)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["self", "padded_self", "self_cut"])
def test_layouts(layout, dtype, gen, cute_varlen_only):
    case = make_case(layout, gen, h=4, hkv=2, d=128, dv=128, lq=LENGTHS).to("cuda")
    check(case, DTYPES[dtype], activation="gelu_tanh", causal=True)


@pytest.mark.parametrize("nq, nk", [(256, 256), (200, 328), (129, 513), (64, 64)])
def test_dense_sides(nq, nk, gen, cute_varlen_only):
    """Nk - Nq of 0, 128 and 384 keys, ragged and short lengths."""
    check(dense_case(gen, nq, nk).to("cuda"), torch.bfloat16, activation="silu", causal=True)


@pytest.mark.parametrize("activation", SUPPORTED_ACTIVATIONS)
def test_activations(activation, gen, cute_varlen_only):
    case = make_case("self", gen, h=4, hkv=4, d=128, dv=128, lq=LENGTHS).to("cuda")
    check(case, torch.bfloat16, activation=activation, causal=True)


@pytest.mark.parametrize("d, dv", [(64, 64), (96, 96), (64, 128), (128, 64), (96, 128)])
def test_head_dims(d, dv, gen, cute_varlen_only):
    case = make_case("self", gen, h=8, hkv=2, d=d, dv=dv, lq=LENGTHS).to("cuda")
    check(case, torch.bfloat16, activation="relu", causal=True)


@pytest.mark.parametrize("layout, activation, max_len", [
    ("self", "silu", 1024), ("padded_self", "gelu_tanh", 1024), ("self", "gelu_tanh", 2000),
    ("padded_self", "silu", 1700),
])
def test_many_samples(layout, activation, max_len, gen, cute_varlen_only):
    """Many samples of random lengths up to ``max_len``, more query tiles than the persistent forward's CTAs: up to
    1024 keys dQ is summed in place, past it in fp32."""
    lengths = torch.randint(0, max_len + 1, (200,), generator=gen).tolist()
    case = make_case(layout, gen, h=4, hkv=4, d=128, dv=128, lq=lengths).to("cuda")
    check(case, torch.bfloat16, activation=activation, causal=True)


@pytest.mark.parametrize("poison", ["k", "v", "q"])
def test_non_finite_values_stay_in_their_sample(poison, gen, cute_varlen_only):
    assert_poison_stays_in_its_sample(gen, poison, causal=True)
