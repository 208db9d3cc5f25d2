"""GPU correctness of the CuTe-DSL varlen backward (skipped without an sm_90 GPU and nvidia-cutlass-dsl).

Against the float64 oracle of tests/varlen_testing.py, the forward and every gradient are within 2x of the oracle's
math in the same dtype (eager), at the same inputs: every layout (jagged self/cross, PMA seeds shared by the
samples, whose dQ is summed over per-sample slices, PFFN per-sample dense weights, padded with lengths), every
activation, bf16 and fp16, GQA, head dims of 64/96/128 equal and not, samples without queries or keys, and batches
of many samples whose longest has at most eight key tiles (dQ summed in place) or more (dQ summed in fp32). The
Triton varlen kernels are made to fail, so each case proves the CuTe forward and backward ran. Gradients of
samples without keys or queries are exactly zero, and non-finite values in one sample leave every other sample's
gradients unchanged to the bit.
"""

from __future__ import annotations

import pytest
import torch
from varlen_testing import LAYOUTS, make_case

from gdpa_inductor.kernels.cute.fwd_support import SUPPORTED_ACTIVATIONS

from .cute_common import NEEDS_CUTE
from .varlen_common import assert_poison_stays_in_its_sample, check

pytestmark = NEEDS_CUTE

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LENGTHS_Q = [300, 0, 1, 129, 17, 64, 256]
LENGTHS_K = [257, 3, 0, 129, 1, 500, 128]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(29)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts(layout, dtype, gen, cute_varlen_only):
    case = make_case(layout, gen, h=4, hkv=2, d=128, dv=128, lq=LENGTHS_Q, lk=LENGTHS_K).to("cuda")
    check(case, DTYPES[dtype], activation="gelu_tanh")


@pytest.mark.parametrize("activation", SUPPORTED_ACTIVATIONS)
def test_activations(activation, gen, cute_varlen_only):
    case = make_case("self", gen, h=4, hkv=4, d=128, dv=128, lq=LENGTHS_Q).to("cuda")
    check(case, torch.bfloat16, activation=activation)


@pytest.mark.parametrize("d, dv", [(64, 64), (96, 96), (64, 128), (128, 64), (96, 128)])
@pytest.mark.parametrize("layout", ["cross", "padded"])
def test_head_dims(layout, d, dv, gen, cute_varlen_only):
    case = make_case(layout, gen, h=8, hkv=2, d=d, dv=dv, lq=LENGTHS_Q, lk=LENGTHS_K).to("cuda")
    check(case, torch.bfloat16, activation="relu")


@pytest.mark.parametrize("layout, activation, max_len", [
    ("self", "gelu_tanh", 1024), ("pma", "sigmoid", 1024), ("padded", "silu", 1024),
    ("self", "gelu_tanh", 2000), ("cross", "silu", 2000), ("pma", "gelu_tanh", 1500),
])
def test_many_samples(layout, activation, max_len, gen, cute_varlen_only):
    """Many samples in a random order, lengths up to ``max_len``: up to 1024 keys dQ is summed in place (at most
    eight key tiles), past it in fp32; PMA's seeds take a dQ slice per sample."""
    lengths = torch.randint(0, max_len + 1, (200,), generator=gen).tolist()
    keys = torch.randint(0, max_len + 1, (200,), generator=gen).tolist()
    case = make_case(layout, gen, h=4, hkv=4, d=128, dv=128, lq=lengths, lk=keys).to("cuda")
    check(case, torch.bfloat16, activation=activation)


@pytest.mark.parametrize("layout, lq, lk", [("cross", [3, 130], [0, 0]), ("cross", [0, 1, 300, 2], [5, 0, 0, 7]),
                                            ("padded", [0, 200, 5], [140, 0, 9])])
def test_samples_without_queries_or_keys(layout, lq, lk, gen, cute_varlen_only):
    """dQ of a sample without keys and dK/dV of a sample without queries are zero (no CTA runs for them), and so
    are the padded rows of a padded batch."""
    case = make_case(layout, gen, h=4, hkv=2, d=128, dv=128, lq=lq, lk=lk).to("cuda")
    _, dq, dk, dv = check(case, torch.bfloat16, activation="sigmoid")
    for grads, own, other in ((dq, case.lq, case.lk), (dk, case.lk, case.lq), (dv, case.lk, case.lq)):
        if layout == "padded":
            for z, n in enumerate(own):
                rows = grads[z] if other[z] == 0 else grads[z, n:]
                assert torch.count_nonzero(rows) == 0
        else:
            starts = [0, *torch.tensor(own).cumsum(0).tolist()]
            for z, n in enumerate(other):
                if n == 0:
                    assert torch.count_nonzero(grads[starts[z]:starts[z + 1]]) == 0


@pytest.mark.parametrize("poison", ["k", "v", "q"])
def test_non_finite_values_stay_in_their_sample(poison, gen, cute_varlen_only):
    assert_poison_stays_in_its_sample(gen, poison)
