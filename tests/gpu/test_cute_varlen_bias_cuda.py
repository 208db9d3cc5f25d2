"""GPU correctness of the CuTe-DSL varlen kernels with a one-element bias (sigmoid attention's -log n over jagged
batches; skipped without an sm_90 GPU and nvidia-cutlass-dsl).

Against the float64 oracle of tests/varlen_testing.py, the forward and dq, dk, dv are each within 2x of the oracle's
math in the same dtype, over jagged self-attention, cross-attention and padded batches, the aligned causal mask,
the band (HSTU's windows), every activation form that meets a bias differently (tanh-based, selects, clamps), bf16
and fp16, GQA, D = 64 to 256, empty and single-token samples. The Triton varlen kernels are made to fail, so each
case proves the CuTe kernels ran. A bias that wants its gradient keeps the CuTe forward and takes the backward
that computes it, dbias checked as well.
"""

from __future__ import annotations

import math

import pytest
import torch
from varlen_testing import make_case

import gdpa_inductor
from gdpa_inductor.kernels.triton import varlen_bwd as triton_varlen_bwd
from gdpa_inductor.kernels.triton import varlen_fwd as triton_varlen_fwd

from .cute_common import NEEDS_CUTE
from .varlen_common import check

pytestmark = NEEDS_CUTE

LENGTHS = [300, 0, 1, 129, 17, 64, 256, 128]
KEY_LENGTHS = [200, 5, 0, 300, 17, 1, 130, 128]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# (layout, dtype, activation, D, Dv, Hkv, bias, mask)
CASES = [
    ("self", "bf16", "sigmoid", 128, 128, 4, -math.log(300), {}),
    ("self", "fp16", "sigmoid", 128, 128, 2, -math.log(300), dict(causal=True)),
    ("self", "bf16", "gelu_tanh", 128, 128, 2, -1.5, dict(causal=True, window=(100, 0))),
    ("cross", "bf16", "silu", 128, 128, 4, 0.75, {}),
    ("cross", "bf16", "gelu_tanh", 128, 128, 2, -1.0, dict(causal=True)),
    ("padded", "bf16", "relu", 64, 64, 4, 0.3, dict(window=(50, 70))),
    ("padded", "fp16", "hardswish", 96, 128, 2, 1.0, {}),
    ("self", "bf16", "gelu", 128, 64, 4, -0.5, {}),
    ("self", "bf16", "gelu_tanh", 256, 256, 4, -1.0, {}),
    ("cross", "bf16", "sigmoid", 256, 256, 2, -math.log(300), {}),
]


def exact_bias(value: float, dtype: torch.dtype) -> torch.Tensor:
    """The bias as the op gets it, for the float64 oracle too: a bias rounded to bf16 moves every score by the same
    amount (-log 300 by 0.015, 1.4% of each gradient), a systematic shift the eager bound does not measure, unlike
    the inputs' independent roundings."""
    return torch.tensor(value, dtype=dtype, device="cuda").double()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(41)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x) for x in c[:7]) + (
    "-" + "-".join(map(str, c[7])) if c[7] else ""))
def test_bias_forward_and_backward_match_float64(case, gen, cute_varlen_only):
    layout, dtype, activation, d, dv, hkv, value, mask = case
    sample = make_case(layout, gen, h=4, hkv=hkv, d=d, dv=dv, lq=LENGTHS, lk=KEY_LENGTHS).to("cuda")
    check(sample, DTYPES[dtype], bias=exact_bias(value, DTYPES[dtype]), bias_grad=False, activation=activation, **mask)


def test_bias_gradient_takes_the_usual_backward(gen, monkeypatch):
    """Under "auto" a bias that wants its gradient runs the CuTe varlen forward and Triton's varlen backward (the
    CuTe backward computes no dbias): output and every gradient, dbias included, within 2x eager's error."""
    monkeypatch.setattr(gdpa_inductor.config, "backend", "auto")
    ran = []

    def recording(name, fn):
        def wrapped(*args, **kwargs):
            ran.append(name)
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(triton_varlen_fwd, "gdpa_varlen_fwd_triton",
                        recording("triton forward", triton_varlen_fwd.gdpa_varlen_fwd_triton))
    monkeypatch.setattr(triton_varlen_bwd, "gdpa_varlen_bwd_triton",
                        recording("triton backward", triton_varlen_bwd.gdpa_varlen_bwd_triton))
    sample = make_case("self", gen, h=4, hkv=2, d=128, dv=128, lq=LENGTHS).to("cuda")
    check(sample, torch.bfloat16, bias=exact_bias(-math.log(300), torch.bfloat16), activation="sigmoid")
    assert ran == ["triton backward"], ran
