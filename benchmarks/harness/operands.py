"""The shapes and operands the benchmarks share: Meta's shapes, the kernels' correctness cases, a shape's operands
and a jagged batch's lengths."""

from __future__ import annotations

import torch

from gdpa_inductor.kernels.cute.fwd_support import SUPPORTED_ACTIVATIONS

# (Nq, Nk) at B=1152, H=4
META_SHAPES = [(256, 256), (512, 512), (1024, 1024), (2048, 2048), (512, 256), (1024, 256), (2048, 256)]

# (activation, dtype, Z, H, Hkv, Nq, Nk, D): every activation ragged, fp16, GQA, D=64, tiny and long rows
CHECK_CASES = [(act, torch.bfloat16, 2, 4, 4, 300, 300, 128) for act in SUPPORTED_ACTIVATIONS] + [
    ("gelu_tanh", torch.float16, 2, 4, 4, 257, 129, 128),
    ("silu", torch.bfloat16, 2, 8, 2, 128, 1000, 128),
    ("silu", torch.bfloat16, 3, 4, 4, 1, 17, 64),
    ("gelu_tanh", torch.bfloat16, 2, 4, 1, 2048, 2048, 64),
    ("sigmoid", torch.bfloat16, 1, 2, 2, 17, 2048, 128),
]


def fresh_operands(batch, heads, nq, nk, d, dv, device="cuda"):
    """(z, q, k, v, do) in bf16 from an emptied allocator cache (the previous shape's blocks are of other sizes);
    a quarter of the batch past 1024² so every shape fits."""
    torch.cuda.empty_cache()
    z = batch if nq * nk <= 1024 * 1024 else batch // 4

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)

    return z, randn(z, heads, nq, d), randn(z, heads, nk, d), randn(z, heads, nk, dv), randn(z, heads, nq, dv)


def lengths_for(batch: int, max_len: int, sparsity: float, gen: torch.Generator) -> torch.Tensor:
    """A jagged batch's lengths: all ``max_len`` at sparsity 1.0, else uniform in [1, max_len]."""
    if sparsity >= 1.0:
        return torch.full((batch,), max_len, dtype=torch.int32)
    return torch.randint(1, max_len + 1, (batch,), generator=gen, dtype=torch.int32)
