"""GPU correctness of the varlen op (skipped without CUDA; run on the lent H100/H200): the Triton varlen kernels, and
the CuTe-DSL ones where they cover a case (sm_90 with nvidia-cutlass-dsl installed; see test_cute_varlen_*_cuda.py).

Against the independent float64 oracle of tests/varlen_testing.py, the op's relative error (forward and every
gradient) is at most 2x that of the oracle's own math in the same dtype (eager), at the same inputs: every
layout (jagged self/cross, PMA seeds, PFFN dense weights, padded with lengths), causal and windows, GQA,
Dv != D, bf16 and fp16, a few head dims, and a batch in the spirit of Meta's (lengths up to 1024).
"""

from __future__ import annotations

import pytest
import torch
from varlen_testing import LAYOUTS, MASKS, bias_for, make_case

from gdpa_inductor.kernels.activations import ACTIVATION_NAMES

from .varlen_common import check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

@pytest.fixture
def cuda_gen():
    return torch.Generator().manual_seed(11)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_masks(layout, mask, dtype, cuda_gen):
    causal, window = MASKS[mask]
    case = make_case(layout, cuda_gen, h=4, hkv=2, d=128, dv=128,
                     lq=[300, 0, 1, 129, 17, 64], lk=[257, 3, 0, 129, 1, 500]).to("cuda")
    check(case, dtype, causal=causal, window=None if window is None else tuple(
        w * 16 if w is not None else None for w in window))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared_bias", "per_sample_bias"])
@pytest.mark.parametrize("layout", ["self", "padded", "pma"])
def test_bias_with_gradient(layout, shared, dtype, cuda_gen):
    """HSTU's relative bias (shared by the samples) or a per-sample bias, causal with a window, and dBias."""
    case = make_case(layout, cuda_gen, h=4, hkv=2, d=128, dv=128,
                     lq=[300, 0, 1, 129, 17, 64], lk=[300, 0, 1, 129, 17, 64]).to("cuda")
    bias = bias_for(case, cuda_gen, shared).to("cuda")
    check(case, dtype, bias=bias, causal=layout != "pma", window=(96, 0) if layout != "pma" else None)


def test_bias_grouped_atomic_gradient(cuda_gen, monkeypatch):
    """A shared bias whose per-sample gradient slices exceed the budget: samples add into fewer slices."""
    from gdpa_inductor.kernels.triton import varlen_bwd

    monkeypatch.setattr(varlen_bwd, "FULL_GRAD_BUFFER_BYTES", 2 * 4 * 300 * 300 * 4)  # 2 slices for 6 samples
    case = make_case("padded", cuda_gen, h=4, hkv=4, d=128, dv=128, lq=[300, 0, 1, 129, 17, 64]).to("cuda")
    check(case, torch.bfloat16, bias=bias_for(case, cuda_gen, True).to("cuda"), causal=True)


@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_activations_bf16(activation, cuda_gen):
    case = make_case("cross", cuda_gen, d=128, dv=128, lq=[200, 1, 77], lk=[150, 64, 300]).to("cuda")
    check(case, torch.bfloat16, activation=activation, causal=True, window=(64, 0))


@pytest.mark.parametrize("d,dv", [(32, 32), (64, 64), (256, 256), (72, 40)])
def test_head_dims(d, dv, cuda_gen):
    case = make_case("self", cuda_gen, h=2, hkv=1, d=d, dv=dv, lq=[100, 257, 5]).to("cuda")
    check(case, torch.bfloat16, causal=True)


def test_meta_like_batch(cuda_gen):
    """64 samples with lengths uniform in [1, 1024] (Meta's sparsity 0.5), H=4, D=128, bf16."""
    lengths = torch.randint(1, 1025, (64,), generator=cuda_gen).tolist()
    case = make_case("self", cuda_gen, h=4, hkv=4, d=128, dv=128, lq=lengths).to("cuda")
    check(case, torch.bfloat16, activation="gelu_tanh")
