"""Host-side helpers shared by the Triton launchers: gradient buffers for broadcast inputs, tile sizes, and the
flags that depend on how we run (4-D [Z, H, N, D] views are ``common/layout.py``'s, shared with CuTe)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernel_flags(dtype: torch.dtype, device: torch.device) -> dict:
    """TANH_APPROX: hardware tanh.approx (GPU only). PRECISE: fp32 needs accurate math and IEEE dots."""
    precise = dtype == torch.float32
    return dict(
        TANH_APPROX=device.type == "cuda" and not interpreting(),
        PRECISE=precise,
        DOT_PRECISION="ieee" if precise else "tf32",
    )


def block_dim(d: int) -> int:
    """tl.dot needs power-of-two tiles of at least 16 along the reduction."""
    return max(16, 1 << (d - 1).bit_length())


def fit_tile(cfg, q_len: int, kv_len: int):
    """Shrinks a tile config's query/key tiles to the sequences (>= 16 for tl.dot): PMA's few seed
    queries or a short key set would otherwise fill most of a 128-row tile with padding."""
    bm = min(cfg.block_m, block_dim(max(q_len, 1)))
    bn = min(cfg.block_n, block_dim(max(kv_len, 1)))
    fitted = dataclasses.replace(cfg, block_m=bm, block_n=bn)
    if getattr(cfg, "dv_pass", None) is not None:
        fitted = dataclasses.replace(fitted, dv_pass=fit_tile(cfg.dv_pass, q_len, kv_len))
    return fitted


@dataclass
class GradBuffer:
    """Where a kernel writes the gradient of an input that may be broadcast over batch (or, for bias,
    any) dims. ``atomic`` means several programs add into one element; ``finish`` gives the gradient
    in the input's shape and dtype, contiguous."""

    view4d: torch.Tensor
    atomic: bool
    finish: Callable[[], torch.Tensor]


# A broadcast input's gradient is written per sample (no atomics) and summed afterwards while the full-size
# buffer stays under this; contended fp32 atomics from every sample were 3x slower for a [H, N, N] bias
# shared by a batch of 256 (H200).
FULL_GRAD_BUFFER_BYTES = 1 << 30


def launcher(kernel, traced: bool):
    """The kernel as a compiled graph launches it (``torch.library.wrap_triton``: Inductor emits the launch) when
    the call is being traced into one, else the kernel itself."""
    return torch.library.wrap_triton(kernel) if traced else kernel


def grad_is_atomic(like: torch.Tensor, full4d: tuple[int, ...], batch: tuple[int, ...]) -> bool:
    """Whether ``grad_buffer`` adds a broadcast input's gradient with atomics into one shared buffer."""
    expanded = tuple(like.shape) != (*batch, *full4d[1:])
    return expanded and math.prod(full4d) * like.element_size() > FULL_GRAD_BUFFER_BYTES


def grad_buffer(
    like: torch.Tensor,
    full4d: tuple[int, ...],
    batch: tuple[int, ...],
    sparse_writes: bool = False,
) -> GradBuffer:
    """``sparse_writes``: the kernel skips some elements (dBias under a causal mask), so start from 0.
    Per-sample buffers use the input's dtype, as eager's own gradient before its sum over the batch."""
    expanded_shape = (*batch, *full4d[1:])
    alloc = torch.zeros if sparse_writes else torch.empty
    if tuple(like.shape) == expanded_shape:
        out = alloc(like.shape, dtype=like.dtype, device=like.device)
        return GradBuffer(out.view(full4d), False, lambda: out)
    if not grad_is_atomic(like, full4d, batch):
        full = alloc(full4d, dtype=like.dtype, device=like.device)
        return GradBuffer(
            full, False, lambda: full.view(expanded_shape).sum_to_size(like.shape).to(like.dtype).contiguous()
        )
    acc = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    try:
        view = acc.expand(expanded_shape).view(full4d)
        return GradBuffer(view, True, lambda: acc.to(like.dtype))
    except RuntimeError:
        full = torch.zeros(full4d, dtype=torch.float32, device=like.device)
        return GradBuffer(
            full, False, lambda: full.view(expanded_shape).sum_to_size(like.shape).to(like.dtype).contiguous()
        )


def strides4(x: torch.Tensor | None) -> tuple[int, int, int, int]:
    return tuple(x.stride()) if x is not None else (0, 0, 0, 0)


def atomic_grads(q, k, v, bias, bias_requires_grad: bool) -> bool:
    """Whether ``gdpa_bwd_triton`` adds a broadcast input's gradient with atomics (``layout.grad_buffer``)."""
    batch = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
    z, (h, nq, d), (hkv, nk, dv) = math.prod(batch), q.shape[-3:], v.shape[-3:]
    grads = [(q, (z, h, nq, d)), (k, (z, hkv, nk, d)), (v, (z, hkv, nk, dv))]
    if bias is not None and bias_requires_grad:
        grads.append((bias, (z, h, nq, nk)))
    return any(grad_is_atomic(x, full4d, batch) for x, full4d in grads)
