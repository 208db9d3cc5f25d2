"""Launchers of the CuTe-DSL backwards over varlen batches: Hopper's (``GdpaBwdSm90`` with ``varlen``, or
``GdpaBwdWideSm90`` past head dims of 128) and Blackwell's (``GdpaBwdSm100`` with ``varlen``,
``gdpa_varlen_bwd_cute_sm100``): the call on the rows the varlen schedule gives
(``kernels/triton/varlen_schedule.py``); which calls they take is ``varlen_support``'s.

Hopper's: one CTA per (128-key tile, head, sample; 64 keys past head dims of 128), samples longest first; a CTA
past its sample's keys, or of a sample without queries, exits at once. Blackwell's: a persistent grid walks the same
tiles in the same order, every warp skipping those tiles. Each side's rows of a sample are read through TMA
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
from .bwd_plan import SM100_BWD_TILE, Sm100BwdPlan, bwd_key_tile, plan_bwd, plan_bwd_sm100
from .bwd_results import dbias_of, dq_of_sums
from .dbias_plan import dbias_way
from .gdpa_bwd import dbias_buffer, sm100_bwd_bias_arg, sm100_bwd_grid
from .gdpa_fwd import sm100_band, sm100_bias_name
from .kernel_args import BWD_SM100_ARGS, bias_tile_modes, dense_modes, offset_arg, row_modes
from .kernel_build import bwd_args, compile_bwd, compile_bwd_sm100
from .operand_views import is_tensor_bias


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
                         bias: torch.Tensor | None = None, bias_grad: bool = False):
    """(dq, dk, dv, dbias or None) of a ``cute_varlen_bwd_support``-checked call; ``dout`` in the output's layout
    (the queries' rows, Dv wide). ``causal``: the bottom-right aligned mask in each sample
    (``varlen_causal_support``'s cases); ``band``: (left, right), the band mask in its place (``varlen_band``);
    ``bias``: one element, added to every score, or a tensor ``varlen_bias_support`` takes (sample z's query i and
    key j adding ``bias[z, h, i, j]``); ``bias_grad``: its gradient is wanted (a tensor's only), dbias in its shape
    and dtype, zero at the positions no sample reaches, summed as ``dbias_sums_for`` finds fits."""
    q, k = qs.tensor, ks.tensor
    h, d = q.shape[-2:]
    hkv, d_v = v.shape[-2:]
    group = h // hkv
    if group > 1:
        # per query head, summed over each kv head's group below
        k, v = k.repeat_interleave(group, dim=-2), v.repeat_interleave(group, dim=-2)
    dout = dout if tma_layout(dout) else dout.contiguous()
    tensor_bias = bias if is_tensor_bias(bias) else None
    if bias_grad and tensor_bias is None:
        raise ValueError("bias_grad=True needs a bias tensor (the CuTe backward's bias gradient is a tensor's)")
    offset = None if tensor_bias is not None else bias
    atomic = bias_grad and dbias_way(qs.batch, h, tensor_bias, varlen=True) == "atomic"
    plan = plan_bwd(q.dtype, d, activation, d_v, num_queries=qs.max_len, num_keys=ks.max_len, varlen=True,
                    causal=causal and band is None, band=band is not None, score_offset=offset is not None,
                    score_bias=tensor_bias is not None, bias_grad=bias_grad, dbias_atomic=atomic)
    # a shared block's per-sample slices are summed afterwards: each slice keeps fp32 only if dQ does
    dq_buf = _grad_buffer(qs, q, q.dtype if plan.dq_sums == "in_place" else torch.float32)
    dk_buf, dv_buf = _grad_buffer(ks, k, k.dtype), _grad_buffer(ks, v, v.dtype)
    num_n = -(-ks.max_len // bwd_key_tile(d, d_v))
    # dS at each sample's positions; zeros where no CTA stores (past a sample's ends, outside its mask)
    ds, sums = None, None
    if bias_grad:
        sums = "atomic" if atomic else "buffer"
        ds = dbias_buffer(sums, qs.batch, h, tensor_bias, zeros=True)
    if min(t.numel() for t in (q, k, v, dout)) > 0 and num_n > 0 and qs.max_len > 0:
        rows = torch.stack([qs.starts, qs.lengths, ks.starts, ks.lengths, order.to(torch.int32)])
        band_left, band_right = band or (None, None)
        compile_bwd(plan)(*bwd_args(plan).values(
            plan, q=row_modes(q), k=row_modes(k), v=row_modes(v), dout=row_modes(dout), dq=row_modes(dq_buf),
            dk=row_modes(dk_buf), dv=row_modes(dv_buf), scale=scale, post_scale=post_scale, slope=negative_slope,
            rows=rows, num_n=num_n, band_left=band_left, band_right=band_right, offset=offset_arg(offset),
            bias=None if tensor_bias is None else bias_tile_modes(tensor_bias),
            dbias=None if ds is None else dense_modes(ds)))
    dq = _summed(dq_buf, q)
    dq = dq.to(q.dtype) if plan.dq_sums == "in_place" else dq_of_sums(dq, q.dtype, activation, scale, post_scale)
    dk, dv = _summed(dk_buf, k).to(k.dtype), _summed(dv_buf, v).to(v.dtype)
    if group > 1:
        dk = dk.unflatten(-2, (hkv, group)).sum(-2)
        dv = dv.unflatten(-2, (hkv, group)).sum(-2)
    return dq, dk, dv, None if ds is None else dbias_of(ds, tensor_bias, sums, activation, post_scale)


def gdpa_varlen_bwd_cute_sm100(dout: torch.Tensor, qs: VarlenSide, ks: VarlenSide, v: torch.Tensor,
                               order: torch.Tensor, activation: ActivationName, scale: float, post_scale: float,
                               negative_slope: float, causal: bool = False, window: tuple[int, int] = (-1, -1),
                               bias: torch.Tensor | None = None, bias_grad: bool = False,
                               plan: Sm100BwdPlan | None = None, ctas: int | None = None):
    """(dq, dk, dv, dbias or None) of the Blackwell backward (``GdpaBwdSm100`` with ``varlen``) on a varlen call's
    sides; ``dout`` in the output's layout (the queries' rows, Dv wide). A persistent grid (``Sm100BwdPlan.grid``)
    walks the (128-key tile, head, sample) tiles, the samples in ``order`` (longest first, the varlen forward's
    order), skipping the key tiles past each sample's keys; dQ summed unscaled in fp32 and scaled here
    (``dq_of_sums``); gradients zero at rows no sample reaches. ``causal``, ``window``: the bottom-right aligned mask
    and the band around it in each sample, at any Nk - Nq. ``bias``: one element (no gradient), or a tensor
    ``sm100_varlen_bwd_support`` takes, sample z's query i and key j adding ``bias[z, h, i, j]``; ``bias_grad``: its
    gradient, summed from a zero-filled [B, H, max_seqlen_q, max_seqlen_k] dS buffer. Shared dense sides and grouped
    heads as in ``gdpa_varlen_bwd_cute``. ``plan``: the build to run (None: ``plan_varlen_bwd_sm100``'s). ``ctas``:
    the grid (None: the plan's for the device; a few make each CTA walk several tiles, as the self-check wants). Not
    yet run on a Blackwell GPU: the dispatch checks each build's results on the device first."""
    q, k = qs.tensor, ks.tensor
    h, d = q.shape[-2:]
    hkv = v.shape[-2]
    group = h // hkv
    if group > 1:
        k, v = k.repeat_interleave(group, dim=-2), v.repeat_interleave(group, dim=-2)
    dout = dout if tma_layout(dout) else dout.contiguous()
    plan = plan or plan_varlen_bwd_sm100(q.dtype, d, activation, causal, window, bias, bias_grad)
    causal, bounds = sm100_band(causal, window)
    bias4 = None if bias is None or bias.numel() == 1 else bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    if bias_grad and bias4 is None:
        raise ValueError("bias_grad=True needs a bias tensor (the CuTe backward's bias gradient is a tensor's)")
    # positions past a sample's lengths, and band-skipped tiles, store no dS
    ds = dbias_buffer("buffer", qs.batch, h, bias4, zeros=True) if bias_grad else None
    dq_buf = _grad_buffer(qs, q, torch.float32)
    dk_buf, dv_buf = _grad_buffer(ks, k, k.dtype), _grad_buffer(ks, v, v.dtype)
    num_n = -(-ks.max_len // SM100_BWD_TILE)
    if min(t.numel() for t in (q, k, v, dout)) > 0 and num_n > 0 and qs.max_len > 0:
        rows = torch.stack([qs.starts, qs.lengths, ks.starts, ks.lengths, order.to(torch.int32)])
        band_left, band_right = bounds or (None, None)
        tiles = num_n * q.shape[-2] * qs.batch
        compile_bwd_sm100(plan)(*BWD_SM100_ARGS.values(
            plan, q=row_modes(q), k=row_modes(k), v=row_modes(v), dout=row_modes(dout), dq=row_modes(dq_buf),
            dk=row_modes(dk_buf), dv=row_modes(dv_buf), scale=scale, post_scale=post_scale, slope=negative_slope,
            num_ctas=sm100_bwd_grid(plan, tiles, num_n, q.device, ctas), band_left=band_left, band_right=band_right,
            rows=rows, num_n=num_n,
            bias=sm100_bwd_bias_arg(bias4 if bias4 is not None else bias, qs.max_len, ks.max_len),
            dbias=None if ds is None else dense_modes(ds)))
    dq = dq_of_sums(_summed(dq_buf, q), q.dtype, activation, scale, post_scale)
    dk, dv = _summed(dk_buf, k).to(k.dtype), _summed(dv_buf, v).to(v.dtype)
    if group > 1:
        dk = dk.unflatten(-2, (hkv, group)).sum(-2)
        dv = dv.unflatten(-2, (hkv, group)).sum(-2)
    dbias = None if ds is None else dbias_of(ds, bias4, "buffer", activation, post_scale).view(bias.shape)
    return dq, dk, dv, dbias


def plan_varlen_bwd_sm100(dtype: torch.dtype, head_dim: int, activation: ActivationName, causal: bool,
                          window: tuple[int, int], bias: torch.Tensor | None = None,
                          bias_grad: bool = False) -> Sm100BwdPlan:
    """The build ``gdpa_varlen_bwd_cute_sm100`` runs for a call of this dtype, head dim, masks and bias: the one its
    self-check keys on."""
    causal, bounds = sm100_band(causal, window)
    return plan_bwd_sm100(dtype, head_dim, activation, causal=causal, window=bounds is not None, varlen=True,
                          bias=sm100_bias_name(bias), bias_grad=bias_grad)
