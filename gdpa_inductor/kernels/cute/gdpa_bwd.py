"""Launcher of the CuTe-DSL Hopper backward: which calls it takes, one compile per (dtype, head dims D and Dv,
activation, way of summing dQ), and the call itself (dQ summed in place in the operands' dtype over short key
ranges, otherwise in fp32 by the kernel and cast here; by pairs of key tiles in clusters of two CTAs on
request)."""

from __future__ import annotations

import os

import torch

from ..triton.gdpa_fwd_tma import tma_layout
from .compile_cache import cached_compile
from .gdpa_fwd import _as_4d, cute_fwd_support, fwd_supported, score_offset_support
from .kernel_args import compile_options, dense_modes, fake_offset, fake_operands, fake_rows, fake_stream, offset_args

# Up to this many key tiles (128 keys; 64 in the wide-head kernel), dQ tiles are added straight into dQ in the
# operands' dtype: the fp32 buffer's zero fill, its reduce traffic and the cast cost 20-30% of the backward at
# 256-1024 keys. Each dQ value then takes one rounding per key tile plus one per sum: on H200 its error measured
# 0.8-1.24x eager PyTorch's own at 512 keys and 0.98-1.52x at 1024 (fp32 sums: 0.5-0.8x), growing as
# sqrt(tiles), so longer ranges keep fp32 (the bound is 2x eager's).
DQ_DIRECT_MAX_KEY_TILES = 8
KEY_TILE = 128

# How the backward sums dQ over key tiles: in place in the operands' dtype, one rounding per key tile
# ("in_place"); in fp32 within each cluster of two CTAs (key tiles 2j, 2j + 1) and then in place, one rounding
# per pair of tiles ("pairs": the rounding count of "in_place" over ranges twice as long, an even number of
# tiles); or in an fp32 buffer cast at the end ("fp32").
DQ_SUMS = ("in_place", "pairs", "fp32")


# Each consumer warpgroup of GdpaBwdSm90 keeps dK and dV of its 64 keys in registers, (D + Dv) / 2 fp32 values a
# thread (128 at D = Dv = 128): larger head dims leave no room for the scores, so past NARROW_MAX_HEAD_DIM the
# wide-head kernel (GdpaBwdWideSm90: 64-key CTAs, every matmul split between the warpgroups) runs instead
BWD_HEAD_DIMS = (64, 96, 128, 256)
NARROW_MAX_HEAD_DIM = 128
WIDE_KEY_TILE = 64


def bwd_key_tile(head_dim: int, head_dim_v: int) -> int:
    """Keys per CTA of the backward for these head dims."""
    return WIDE_KEY_TILE if max(head_dim, head_dim_v) > NARROW_MAX_HEAD_DIM else KEY_TILE


def _within_bwd_head_dims(check: tuple[bool, str], q: torch.Tensor, v: torch.Tensor) -> tuple[bool, str]:
    """A forward support check's (ok, reason), narrowed to the backward's head dims."""
    d, dv = q.shape[-1], v.shape[-1]
    if check[0] and not (d in BWD_HEAD_DIMS and dv in BWD_HEAD_DIMS):
        return False, f"head dims (D={d}, Dv={dv}) must each be one of {BWD_HEAD_DIMS} for the CuTe backward"
    return check


def without_bias_grad(check: tuple[bool, str], bias_grad: bool) -> tuple[bool, str]:
    """A support check's (ok, reason), narrowed to calls that want no bias gradient."""
    if check[0] and bias_grad:
        return False, "the CuTe backward computes no bias gradient"
    return check


def _one_element_bias(check: tuple[bool, str], bias) -> tuple[bool, str]:
    """A forward support check's (ok, reason), narrowed to the backward's biases: one element only (the forward
    also reads a bias tensor)."""
    return score_offset_support(bias, "the CuTe backward") if check[0] else check


def bwd_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: str,
                  bias_grad: bool = False):
    """(ok, reason) for the CuTe backward on [Z, H, N, D] operands: the forward's cases at the backward's head
    dims, without a bias gradient (``bias_grad``: whether the call wants one)."""
    check = _within_bwd_head_dims(fwd_supported(q, k, v, bias, causal, activation), q, v)
    return without_bias_grad(_one_element_bias(check, bias), bias_grad)


def cute_bwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: str,
                     bias_grad: bool = False):
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting): the forward's cases, its
    causal mask and one-element bias included (``causal_support``, ``score_offset_support``), at the backward's
    head dims, without a bias gradient."""
    check = _within_bwd_head_dims(cute_fwd_support(q, k, v, bias, causal, activation), q, v)
    return without_bias_grad(_one_element_bias(check, bias), bias_grad)


def compile_bwd(
    dtype: torch.dtype, head_dim: int, activation: str, keep_ptx: bool = False,
    dq_sums: str = "fp32", head_dim_v: int | None = None, varlen: bool = False, causal: bool = False,
    band: bool = False, score_offset: bool = False,
):
    """The compiled backward for (dtype, head dims, activation, ``dq_sums``: one of ``DQ_SUMS``, varlen or
    not, causal or not), cached in memory and on disk (``compile_cache``); sizes and strides are runtime values.
    Compiled against fake tensors (``kernel_args``); called with the seven tensors in the kernel's mode order, the
    three scalars and, varlen, the (5, B) rows tensor and the longest sample's key tiles. ``head_dim_v``: V's and
    dO's head dim (None: ``head_dim``). ``causal``: the bottom-right aligned mask (``causal_support``'s cases, or
    varlen ``varlen_causal_support``'s), dQ not summed by pairs. ``band`` (varlen): the mask of a band around each
    sample's diagonal, its bounds the call's arguments after the rows. ``score_offset``: a one-element bias, the
    call's last argument (after Nones for the varlen and band arguments it lacks; ``GdpaBwdSm90``)."""
    if dq_sums not in DQ_SUMS:
        raise ValueError(f"dq_sums must be one of {DQ_SUMS}, got {dq_sums!r}")
    if varlen and dq_sums == "pairs":
        raise ValueError("dq_sums='pairs' is not available for varlen batches")
    if causal and dq_sums == "pairs":
        raise ValueError("the causal CuTe backward takes dq_sums 'in_place' or 'fp32'")
    if band and not varlen:
        raise ValueError("band=True needs varlen=True (the band mask is in the varlen kernels)")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    wide = max(head_dim, head_dim_v) > NARROW_MAX_HEAD_DIM
    if wide and (causal or band or dq_sums == "pairs"):
        raise ValueError(f"the wide-head backward (D={head_dim}, Dv={head_dim_v}) takes no mask and no dQ pairs")
    key = ("bwd", str(dtype), head_dim, head_dim_v, activation, dq_sums, keep_ptx, varlen)
    if causal:
        key = (*key, "causal")
    if band:
        key = (*key, "band")
    if score_offset:
        key = (*key, "offset")

    def build():
        import cutlass
        import cutlass.cute as cute

        from . import activation_math
        from .gdpa_bwd_sm90 import GdpaBwdSm90
        from .gdpa_bwd_wide_sm90 import GdpaBwdWideSm90

        element = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}[dtype]
        dq_element = cutlass.Float32 if dq_sums == "fp32" else element
        args = fake_operands(element, 4) + fake_operands(dq_element, 1) + fake_operands(element, 2)
        # varlen: the rows tensor and the longest sample's key tiles follow the stream
        extra = [fake_rows(), cutlass.Int32(1)] if varlen else []
        extra += [cutlass.Int32(1), cutlass.Int32(1)] if band else []
        if score_offset:
            extra += [None] * (4 - len(extra)) + [fake_offset()]
        one = cutlass.Float32(1.0)
        form = activation_math.backward_form(activation)
        if wide:
            kernel = GdpaBwdWideSm90(element, head_dim, head_dim_v, form, dq_element, varlen=varlen,
                                     score_offset=score_offset)
        else:
            kernel = GdpaBwdSm90(
                element, head_dim, head_dim_v, form, dq_element, dq_pairs=dq_sums == "pairs",
                dq_late=dq_late_for(dq_sums, head_dim, head_dim_v), varlen=varlen, causal=causal, band=band,
                score_offset=score_offset,
            )
        return cute.compile(kernel, *args, one, one, one, fake_stream(), *extra, options=compile_options(keep_ptx))

    return cached_compile(key, build, persist=not keep_ptx)


def dq_late_for(dq_sums: str, head_dim: int, head_dim_v: int) -> bool:
    """Whether the backward computes dQ one query tile late (``GdpaBwdSm90``'s ``dq_late``): everywhere but
    where dQ is summed in place at D = Dv = 128, where the warpgroups meeting every tile measured 2-5% faster
    (H200, 512² to 1024², twentieth session); with fp32 sums one tile late is 3-5% faster with gelu_tanh at
    1024² and 2048², level with silu at 2048²."""
    return not (dq_sums == "in_place" and head_dim == head_dim_v == 128)


# The pairs are not taken by default: with the backward forms that move the activation's factors out of the
# per-score work (activation_math.backward_form) the fp32 buffer gained more than they did, and the pairs no
# longer win past the noise (H200, gelu_tanh, bwd TF/s, fp32 -> pairs, benchmarks/bench_dq_sums.py
# --only-head-dims): at D = Dv = 128 470 -> 475 (1280 keys), 476 -> 485 (1536), 499 -> 495 (2048; a same-process
# A/B at 2048: 509-518 -> 493-497); at every other head dim they lose 4-13%.
def dq_sums_for(num_keys: int, key_tile: int = KEY_TILE) -> str:
    """How dQ is summed over ``num_keys`` keys in CTAs of ``key_tile`` keys by default (one of ``DQ_SUMS``): in
    place in the operands' dtype up to ``DQ_DIRECT_MAX_KEY_TILES`` roundings, else in fp32."""
    return "in_place" if -(-num_keys // key_tile) <= DQ_DIRECT_MAX_KEY_TILES else "fp32"


def gdpa_bwd_cute(
    q, k, v, grad_out, activation: str, scale: float, post_scale: float, negative_slope: float,
    dq_sums: str | None = None, causal: bool = False, bias: torch.Tensor | None = None,
):
    """q [Z, H, Nq, D], k [Z, Hkv, Nk, D], v [Z, Hkv, Nk, Dv], grad_out [Z, H, Nq, Dv] (``bwd_supported``
    checked) -> (dq, dk, dv).
    ``dq_sums``: one of ``DQ_SUMS`` (None: ``dq_sums_for`` decides by the key count; "pairs" needs an even
    number of key tiles, and no ``causal``). ``causal``: the bottom-right aligned mask. ``bias``: one element (any
    float dtype), added to every score (no gradient)."""
    z, h, nq, d = q.shape
    hkv, nk, d_v = k.shape[1], k.shape[2], v.shape[-1]
    group = h // hkv
    if group > 1:
        # per query head, summed over each kv head's group below
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    grad_out = grad_out if tma_layout(grad_out) else grad_out.contiguous()
    dq_sums = dq_sums_for(nk, bwd_key_tile(d, d_v)) if dq_sums is None else dq_sums
    if dq_sums == "pairs" and -(-nk // KEY_TILE) % 2:
        raise ValueError(f"dq_sums='pairs' needs an even number of {KEY_TILE}-key tiles, got {nk} keys")
    direct = dq_sums != "fp32"
    dq_acc = torch.zeros((z, h, nq, d), dtype=q.dtype if direct else torch.float32, device=q.device)
    dk = torch.empty((z, h, nk, d), dtype=q.dtype, device=q.device)
    dv = torch.empty((z, h, nk, d_v), dtype=q.dtype, device=q.device)
    if dq_acc.numel() and dk.numel():
        fn = compile_bwd(q.dtype, d, activation, dq_sums=dq_sums, head_dim_v=d_v, causal=causal,
                         score_offset=bias is not None)
        # no rows, no key-tile count, no band: a dense batch (a function loaded from the disk cache fills in no
        # defaults)
        fn(*(dense_modes(t) for t in (q, k, v, grad_out, dq_acc, dk, dv)), scale, post_scale, negative_slope, None,
           None, None, None, *offset_args(bias))
    else:
        dk.zero_()
        dv.zero_()
    dq = dq_acc if direct else dq_acc.to(q.dtype)
    if group > 1:
        dk = dk.view(z, hkv, group, nk, d).sum(2)
        dv = dv.view(z, hkv, group, nk, d_v).sum(2)
    return dq, dk, dv


def gdpa_bwd_cute_batched(grad_out, q, k, v, activation: str, scale: float, post_scale: float, negative_slope: float,
                          causal: bool = False, bias: torch.Tensor | None = None):
    """The op's backward on the CuTe kernel: [..., H, N, D] operands of one batch shape (``cute_bwd_support``
    checked: no broadcast dims) -> (dq, dk, dv) in the inputs' shapes."""
    (q4, k4, v4), batch = _as_4d(q, k, v)
    do4 = grad_out.reshape(*q4.shape[:3], v4.shape[-1])
    dq, dk, dv = gdpa_bwd_cute(q4, k4, v4, do4, activation, scale, post_scale, negative_slope, causal=causal,
                               bias=bias)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
