"""Which calls the TMA forward takes (the layouts TMA can read); its compile for sm_90a is checked in
``test_triton_compile_sm90.py`` and its results on the GPU in ``tests/gpu/test_gdpa_cuda.py``."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor.kernels.common.layout import as_4d
from gdpa_inductor.kernels.triton import tma_support


@pytest.fixture
def hopper(monkeypatch):
    """Stands the CPU tensors in for tensors on a Hopper GPU."""
    monkeypatch.setattr(tma_support, "on_tma_gpu", lambda device: True)


def _qkv(shape=(2, 4, 33, 64), dtype=torch.bfloat16, dv=None):
    q = torch.randn(shape).to(dtype)
    v = torch.randn(*shape[:-1], dv or shape[-1]).to(dtype)
    return q, q.clone(), v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_contiguous_half_precision_takes_tma(dtype, hopper):
    assert tma_support.tma_supported(*_qkv(dtype=dtype), None)


def test_a_bnhd_projection_view_takes_tma(hopper):
    """[B, N, H, D] projections transposed to [B, H, N, D]: rows 16-byte aligned, no copy needed."""
    q = torch.randn(2, 33, 4, 64).bfloat16().transpose(1, 2)
    assert tma_support.tma_supported(q, q, q, None)


@pytest.mark.parametrize("case", ["bias", "fp32", "odd_head_dim", "head_dim_256", "broadcast_batch",
                                  "strided_last_dim", "misaligned_rows"])
def test_other_calls_take_the_pointer_kernel(case, hopper):
    q, k, v = _qkv()
    bias = None
    if case == "bias":
        bias = torch.randn(4, 33, 33).bfloat16()
    elif case == "fp32":
        q, k, v = _qkv(dtype=torch.float32)
    elif case == "odd_head_dim":
        q, k, v = _qkv(shape=(2, 4, 33, 72))
    elif case == "head_dim_256":
        q, k, v = _qkv(shape=(2, 4, 33, 256))
    elif case == "broadcast_batch":  # PMA's seed queries: a stride-0 batch dim
        q = as_4d(torch.randn(1, 4, 33, 64).bfloat16(), (2,))
    elif case == "strided_last_dim":
        q = torch.randn(2, 4, 33, 128).bfloat16()[..., ::2]
    else:  # head dim 16 read from rows of 20 elements: 40 bytes apart, not a multiple of 16
        q = torch.randn(2, 4, 33, 20).bfloat16()[..., :16]
    assert not tma_support.tma_supported(q, k, v, bias), case


def test_no_tma_off_the_gpu():
    assert not tma_support.on_tma_gpu(torch.device("cpu"))
    assert not tma_support.tma_supported(*_qkv(), None)
