"""GPU correctness of the CuTe-DSL varlen forward and backward under a band mask (skipped without an sm_90 GPU and
nvidia-cutlass-dsl): sliding windows (HSTU's ``max_attn_len`` is ``causal=True, window=(W, 0)``; two-sided windows
without causal) and the causal mask wherever the kernels cannot know each sample's diagonal to align with their
tiles (two cu_seqlens or seqused tensors, dense sides whose lengths differ by anything, more queries than keys).

Against the float64 oracle of tests/varlen_testing.py (the mask by explicit index comparison), the forward and every
gradient are within 2x of the oracle's math in the same dtype, over ragged, empty, single-token and many-tile
samples, windows narrower than a key tile, of one, across one and over several, every activation, bf16 and fp16,
GQA, head dims of 64 to 128, and batches whose longest sample has at most eight key tiles (dQ summed in place) or
more (fp32). The Triton varlen kernels are made to fail, so each case proves the CuTe kernels ran. Non-finite values
in one sample leave every other sample's output and gradients unchanged to the bit.
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
KEY_LENGTHS = [200, 5, 0, 300, 17, 1, 130, 128]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(37)


@pytest.mark.parametrize("layout", ["self", "self_cut"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("max_attn_len", [0, 1, 100, 128, 300])
def test_hstu_windows(max_attn_len, dtype, layout, gen, cute_varlen_only):
    """HSTU's max_attn_len over jagged self-attention: windows of no key but the diagonal's, narrower than a key
    tile, of one, and longer than most samples; also with samples cut short (a padded batch's N)."""
    case = make_case(layout, gen, h=4, hkv=2, d=128, dv=128, lq=LENGTHS).to("cuda")
    check(case, DTYPES[dtype], activation="gelu_tanh", causal=True, window=(max_attn_len, 0))


@pytest.mark.parametrize("window", [(50, 70), (0, 0), (200, -1), (-1, 140)])
@pytest.mark.parametrize("layout", ["self", "cross", "padded"])
def test_two_sided_windows(layout, window, gen, cute_varlen_only):
    """Windows without causal, one side unbounded or both bounded, over samples with other key than query
    lengths (the band's diagonal then off the tiles')."""
    case = make_case(layout, gen, h=4, hkv=4, d=128, dv=128, lq=LENGTHS, lk=KEY_LENGTHS).to("cuda")
    check(case, torch.bfloat16, activation="silu", window=window)


@pytest.mark.parametrize("layout", ["cross", "padded"])
def test_causal_with_any_offsets(layout, gen, cute_varlen_only):
    """The causal mask where queries and keys take their lengths from two tensors: each sample's Nk - Nq is
    anything, negative too (query rows before the first key's diagonal have no keys: zero output)."""
    case = make_case(layout, gen, h=4, hkv=2, d=128, dv=128, lq=LENGTHS, lk=KEY_LENGTHS).to("cuda")
    check(case, torch.bfloat16, activation="gelu_tanh", causal=True)


def test_causal_with_equal_lengths_in_two_tensors(gen, cute_varlen_only):
    """Self-attention whose keys' cu_seqlens is a copy of the queries': the kernels cannot know the offsets equal,
    and run the band."""
    case = make_case("self", gen, h=4, hkv=4, d=128, dv=128, lq=LENGTHS).to("cuda")
    case.kwargs["cu_seqlens_k"] = case.kwargs["cu_seqlens_q"].clone()
    check(case, torch.bfloat16, activation="silu", causal=True)


@pytest.mark.parametrize("nq, nk", [(200, 300), (300, 200), (129, 1000), (64, 64)])
@pytest.mark.parametrize("mask", ["causal", "hstu"])
def test_dense_sides(mask, nq, nk, gen, cute_varlen_only):
    """Full dense sides with Nk - Nq of 100, -100, 871 and 0."""
    params = dict(causal=True, window=(150, 0)) if mask == "hstu" else dict(causal=True)
    if mask == "causal" and nk >= nq and (nk - nq) % 128 == 0:
        pytest.skip("an aligned diagonal: the causal builds, not the band (test_cute_varlen_causal_cuda.py)")
    check(dense_case(gen, nq, nk).to("cuda"), torch.bfloat16, activation="relu", **params)


@pytest.mark.parametrize("activation", SUPPORTED_ACTIVATIONS)
def test_activations(activation, gen, cute_varlen_only):
    case = make_case("self", gen, h=4, hkv=4, d=128, dv=128, lq=LENGTHS).to("cuda")
    check(case, torch.bfloat16, activation=activation, causal=True, window=(140, 0))


@pytest.mark.parametrize("d, dv", [(64, 64), (96, 96), (64, 128), (128, 64), (96, 128)])
def test_head_dims(d, dv, gen, cute_varlen_only):
    case = make_case("cross", gen, h=8, hkv=2, d=d, dv=dv, lq=LENGTHS, lk=KEY_LENGTHS).to("cuda")
    check(case, torch.bfloat16, activation="sigmoid", causal=True, window=(90, 0))


@pytest.mark.parametrize("layout, window, max_len", [
    ("self", (256, 0), 1024), ("cross", (300, 300), 1024), ("self", (512, 0), 2000), ("padded", (700, 0), 1700),
])
def test_many_samples(layout, window, max_len, gen, cute_varlen_only):
    """Many samples of random lengths up to ``max_len``, more query tiles than the persistent forward's CTAs: up to
    1024 keys dQ is summed in place, past it in fp32."""
    lq = torch.randint(0, max_len + 1, (200,), generator=gen).tolist()
    lk = torch.randint(0, max_len + 1, (200,), generator=gen).tolist()
    case = make_case(layout, gen, h=4, hkv=4, d=128, dv=128, lq=lq, lk=lk).to("cuda")
    check(case, torch.bfloat16, activation="silu", causal=window[1] == 0, window=window)


@pytest.mark.parametrize("poison", ["k", "v", "q"])
def test_non_finite_values_stay_in_their_sample(poison, gen, cute_varlen_only):
    assert_poison_stays_in_its_sample(gen, poison, causal=True, window=(60, 0))
