"""Launcher of the CuTe-DSL Hopper backward: which calls it takes, one compile per (dtype, head dim,
activation), and the call itself (dQ accumulated in fp32 by the kernel, cast here)."""

from __future__ import annotations

import os

import torch

from ..triton.gdpa_fwd_tma import tma_layout
from .gdpa_fwd import _as_4d, _as_cute, _fake_operands, fwd_supported

_COMPILED: dict = {}


def bwd_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: str):
    """(ok, reason) for the CuTe backward on [Z, H, N, D] operands: the forward's cases."""
    return fwd_supported(q, k, v, bias, causal, activation)


def compile_bwd(dtype: torch.dtype, head_dim: int, activation: str, operands=None, keep_ptx: bool = False):
    """The compiled backward for (dtype, head dim, activation), cached; sizes and strides are runtime values.
    ``operands``: the call's seven tensors in the kernel's form; without them, fake tensors (no GPU)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    key = (dtype, head_dim, activation, operands is None, keep_ptx)
    if key not in _COMPILED:
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_fake_stream

        from . import activation_math
        from .gdpa_bwd_sm90 import GdpaBwdSm90

        element = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}[dtype]
        if operands is None:
            q, k, v, do = _fake_operands(element, 4)
            (dq,) = _fake_operands(cutlass.Float32, 1)
            dk, dv = _fake_operands(element, 2)
            operands = [q, k, v, do, dq, dk, dv]
        one = cutlass.Float32(1.0)
        kernel = GdpaBwdSm90(element, head_dim, getattr(activation_math, f"{activation}_and_grad"))
        _COMPILED[key] = cute.compile(
            kernel, *operands, one, one, one, make_fake_stream(), options="--keep-ptx" if keep_ptx else ""
        )
    return _COMPILED[key]


def gdpa_bwd_cute(q, k, v, grad_out, activation: str, scale: float, post_scale: float, negative_slope: float):
    """q/grad_out [Z, H, Nq, D], k/v [Z, Hkv, Nk, D] (``bwd_supported`` checked) -> (dq, dk, dv)."""
    import cuda.bindings.driver as cuda
    import cutlass

    z, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group = h // hkv
    if group > 1:
        # per query head, summed over each kv head's group below
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    grad_out = grad_out if tma_layout(grad_out) else grad_out.contiguous()
    dq_acc = torch.zeros((z, h, nq, d), dtype=torch.float32, device=q.device)
    dk = torch.empty((z, h, nk, d), dtype=q.dtype, device=q.device)
    dv = torch.empty((z, h, nk, d), dtype=q.dtype, device=q.device)
    if dq_acc.numel() and dk.numel():
        operands = [_as_cute(t) for t in (q, k, v, grad_out, dq_acc, dk, dv)]
        fn = compile_bwd(q.dtype, d, activation, operands)
        stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
        fn(*operands, cutlass.Float32(scale), cutlass.Float32(post_scale), cutlass.Float32(negative_slope), stream)
    else:
        dk.zero_()
        dv.zero_()
    dq = dq_acc.to(q.dtype)
    if group > 1:
        dk = dk.view(z, hkv, group, nk, d).sum(2)
        dv = dv.view(z, hkv, group, nk, d).sum(2)
    return dq, dk, dv


def gdpa_bwd_cute_batched(grad_out, q, k, v, activation: str, scale: float, post_scale: float, negative_slope: float):
    """The op's backward on the CuTe kernel: [..., H, N, D] operands of one batch shape (``cute_fwd_support``
    checked: no broadcast dims) -> (dq, dk, dv) in the inputs' shapes."""
    (q4, k4, v4), batch = _as_4d(q, k, v)
    do4 = grad_out.reshape(q4.shape)
    dq, dk, dv = gdpa_bwd_cute(q4, k4, v4, do4, activation, scale, post_scale, negative_slope)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
