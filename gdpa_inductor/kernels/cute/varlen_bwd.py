"""Launcher of the CuTe-DSL Hopper backward over varlen batches (``GdpaBwdSm90`` with ``varlen``, or
``GdpaBwdWideSm90`` past head dims of 128): which calls it takes, and the call on the rows the varlen schedule gives
(``kernels/triton/varlen_schedule.py``).

One CTA per (128-key tile, head, sample; 64 keys past head dims of 128), samples longest first; a CTA past its
sample's keys, or of a sample without queries, exits at once. Each side's rows of a sample are read through TMA
descriptors bounded at the sample's end, so dK and dV stores and the dQ reduce-adds are clipped there. dQ is summed
in place in the operands' dtype when the longest sample has at most ``DQ_DIRECT_MAX_KEY_TILES`` key tiles (the
dense backward's rule), else in fp32. A dense side all samples share (PMA's seed queries, a shared key block) gets
one gradient slice per sample, summed here in fp32; GQA's key/value heads are expanded to the query heads and their
gradients summed over each group, as in the dense launcher.
"""

from __future__ import annotations

import torch

from ..activations import ActivationName
from ..common.layout import tma_layout
from ..common.varlen_rows import VarlenSide
from ..reference_varlen import varlen_batch
from .gdpa_bwd import (
    BWD_HEAD_DIMS,
    bias_tile_modes,
    bwd_bias_support,
    bwd_key_tile,
    compile_bwd,
    dbias_buffer,
    dbias_of,
    dbias_way,
    dq_of_sums,
    dq_sums_for,
)
from .kernel_args import dense_modes, offset_args, row_modes
from .varlen_fwd import cute_varlen_fwd_support


def cute_varlen_bwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                            window: tuple[int, int], activation: ActivationName, rows: tuple,
                            bias_grad: bool = False) -> tuple[bool, str]:
    """(ok, reason) for the CuTe varlen backward: the varlen forward's cases (``rows``: the call's cu_seqlens and
    seqused, for its causal rule) at the dense backward's head dims (``BWD_HEAD_DIMS``; masks only up to 128), a
    bias tensor and its gradient (``bias_grad``: whether the call wants one) where the dense backward takes them
    (``bwd_bias_support``)."""
    check = cute_varlen_fwd_support(q, k, v, bias, causal, window, activation, rows, "the CuTe varlen backward",
                                    BWD_HEAD_DIMS)
    return bwd_bias_support(check, bias, q, v, bias_grad, (varlen_batch(q, k, rows[0], rows[1]), q.shape[-2]),
                            varlen=True)


def _shared(side: VarlenSide, t: torch.Tensor) -> bool:
    """Whether ``t`` is one dense block every sample of ``side`` reads."""
    return not side.jagged and t.shape[0] == 1 and side.batch > 1


def _grad_buffer(side: VarlenSide, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where the kernel writes a side's gradient: ``like``'s shape, or a slice per sample for a shared block.
    Zero-filled: the kernel never writes rows past a sample's length, nor those of samples without work."""
    shape = (side.batch, *like.shape[1:]) if _shared(side, like) else like.shape
    return torch.zeros(shape, dtype=dtype, device=like.device)


def _summed(buf: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A gradient buffer in ``like``'s shape: per-sample slices summed in fp32."""
    return buf.sum(0, keepdim=True, dtype=torch.float32) if buf.shape[0] != like.shape[0] else buf


def gdpa_varlen_bwd_cute(dout: torch.Tensor, qs: VarlenSide, ks: VarlenSide, v: torch.Tensor, order: torch.Tensor,
                         activation: ActivationName, scale: float, post_scale: float, negative_slope: float,
                         causal: bool = False, band: tuple[int, int] | None = None,
                         bias: torch.Tensor | None = None, bias_grad: bool = False, dbias_sums: str | None = None):
    """(dq, dk, dv, dbias or None) of a ``cute_varlen_bwd_support``-checked call; ``dout`` in the output's layout
    (the queries' rows, Dv wide). ``causal``: the bottom-right aligned mask in each sample
    (``varlen_causal_support``'s cases); ``band``: (left, right), the band mask in its place (``varlen_band``);
    ``bias``: one element, added to every score, or a tensor ``varlen_bias_support`` takes (sample z's query i and
    key j adding ``bias[z, h, i, j]``); ``bias_grad``: its gradient is wanted (a tensor's only), dbias in its shape
    and dtype, zero at the positions no sample reaches, summed as ``dbias_sums`` says (one of ``DBIAS_SUMS``; None:
    ``dbias_sums_for``)."""
    q, k = qs.tensor, ks.tensor
    h, d = q.shape[-2:]
    hkv, d_v = v.shape[-2:]
    group = h // hkv
    if group > 1:
        # per query head, summed over each kv head's group below
        k, v = k.repeat_interleave(group, dim=-2), v.repeat_interleave(group, dim=-2)
    dout = dout if tma_layout(dout) else dout.contiguous()
    key_tile = bwd_key_tile(d, d_v)
    dq_sums = dq_sums_for(ks.max_len, key_tile)
    # a shared block's per-sample slices are summed afterwards: each slice keeps fp32 only if dQ does
    dq_buf = _grad_buffer(qs, q, q.dtype if dq_sums == "in_place" else torch.float32)
    dk_buf, dv_buf = _grad_buffer(ks, k, k.dtype), _grad_buffer(ks, v, v.dtype)
    num_n = -(-ks.max_len // key_tile)
    tensor_bias = bias if bias is not None and bias.numel() != 1 else None
    if bias_grad and tensor_bias is None:
        raise ValueError("bias_grad=True needs a bias tensor (the CuTe backward's bias gradient is a tensor's)")
    offset = None if tensor_bias is not None else bias
    # dS at each sample's positions; zeros where no CTA stores (past a sample's ends, outside its mask)
    ds, sums = None, None
    if bias_grad:
        sums = dbias_way(dbias_sums, qs.batch, h, tensor_bias, varlen=True)
        ds = dbias_buffer(sums, qs.batch, h, tensor_bias, zeros=True)
    if min(t.numel() for t in (q, k, v, dout)) > 0 and num_n > 0 and qs.max_len > 0:
        rows = torch.stack([qs.starts, qs.lengths, ks.starts, ks.lengths, order.to(torch.int32)])
        fn = compile_bwd(q.dtype, d, activation, dq_sums=dq_sums, head_dim_v=d_v, varlen=True,
                         causal=causal and band is None, band=band is not None, score_offset=offset is not None,
                         score_bias=tensor_bias is not None, bias_grad=bias_grad, dbias_atomic=sums == "atomic")
        fn(*(row_modes(t) for t in (q, k, v, dout, dq_buf, dk_buf, dv_buf)), scale, post_scale, negative_slope,
           rows, num_n, *(band or (None, None)), *offset_args(offset),
           None if tensor_bias is None else bias_tile_modes(tensor_bias), None if ds is None else dense_modes(ds),
           None, None)
    dq = _summed(dq_buf, q)
    dq = dq.to(q.dtype) if dq_sums == "in_place" else dq_of_sums(dq, q.dtype, activation, scale, post_scale)
    dk, dv = _summed(dk_buf, k).to(k.dtype), _summed(dv_buf, v).to(v.dtype)
    if group > 1:
        dk = dk.unflatten(-2, (hkv, group)).sum(-2)
        dv = dv.unflatten(-2, (hkv, group)).sum(-2)
    return dq, dk, dv, None if ds is None else dbias_of(ds, tensor_bias, sums, activation, post_scale)
