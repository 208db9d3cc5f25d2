"""Launcher of the CuTe-DSL Hopper backward: which calls it takes, one compile per (dtype, head dims D and Dv,
activation, way of summing dQ), and the call itself (dQ summed in place in the operands' dtype over short key
ranges, otherwise in fp32 by the kernel and scaled and cast here; by pairs of key tiles in clusters of two CTAs on
request)."""

from __future__ import annotations

import torch

from ... import config
from ..common import dq_fragments, dq_round
from ..common.layout import tma_layout
from .compile_cache import cached_compile
from .dq_workspace import zeroed_dq_sums
from .gdpa_fwd import _as_4d, _bias_4d, cute_fwd_support, fwd_supported
from .kernel_args import (
    compile_options,
    dense_modes,
    fake_counts,
    fake_offset,
    fake_operands,
    fake_rows,
    fake_stream,
    offset_args,
)

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


def _is_tensor_bias(bias) -> bool:
    return bias is not None and bias.numel() != 1


def bias_tensor_bwd_support(bias: torch.Tensor, q: torch.Tensor, v: torch.Tensor) -> tuple[bool, str]:
    """(ok, reason) for a bias tensor the forward takes (``score_bias_support``, in its 4-D form) in the CuTe
    backward: the 128-key kernel (D and Dv at most 128), which loads each (64 queries x 128 keys) tile of it by TMA
    (from a padded copy where TMA cannot read it in place, ``tma_bias``)."""
    d, dv = q.shape[-1], v.shape[-1]
    if max(d, dv) > NARROW_MAX_HEAD_DIM:
        return False, f"the CuTe backward reads a bias tensor at D and Dv up to {NARROW_MAX_HEAD_DIM} (got {d}, {dv})"
    return True, ""


# TMA reads and writes rows that start 16 bytes apart: the bias's and dS's columns padded to 8 16-bit values
TMA_COLUMNS = 8


def tma_bias(bias: torch.Tensor) -> torch.Tensor:
    """``bias`` ([Zb, Hb, Nq, Nk]) itself where TMA can load its tiles in place (Nk and every stride of a dim above
    one a multiple of ``TMA_COLUMNS``, 16-byte aligned), else a copy with its rows padded to a multiple of
    ``TMA_COLUMNS`` columns, seen as the bias's columns (Nk = 300, a sliced position table: the backward stays on the
    CuTe kernel for one copy of the bias). A bias of one row seen as Nq rows of stride 0 copies its one row."""
    strides = [s for n, s in zip(bias.shape[:-1], bias.stride()[:-1]) if n > 1]
    if not (bias.shape[-1] % TMA_COLUMNS or any(s % TMA_COLUMNS for s in strides) or bias.data_ptr() % 16):
        return bias
    one_row = bias.shape[-2] > 1 and bias.stride(-2) == 0
    stored = bias[..., :1, :] if one_row else bias
    cols = bias.shape[-1]
    padded = torch.empty((*stored.shape[:-1], _padded(cols, TMA_COLUMNS)), dtype=bias.dtype, device=bias.device)
    copy = padded[..., :cols].copy_(stored)
    return copy.expand(bias.shape) if one_row else copy


def spare_device_bytes(device: torch.device) -> int:
    """Bytes the caching allocator could still hand out on ``device``: the driver's free memory and the blocks the
    allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


# How the CuTe backward sums dbias: each CTA stores its dS tiles into a buffer of every (sample, head)'s dS, summed
# over the bias's broadcast dims afterwards ("buffer"), or adds them in fp32 into a tensor of the bias's own size
# ("atomic", ``GdpaBwdSm90``'s ``dbias_atomic``).
DBIAS_SUMS = ("buffer", "atomic")
QUERY_TILE = 64

# Queries per step of GdpaBwdSm90: 64, or 80 (flash-attn's tile at D = 128: a fifth fewer steps, K and V read a fifth
# less often per FLOP) where dQ is summed in fp32 at D = Dv = 128 without a mask or bias tensor in a dense batch.
# Taken by default for the activations whose backward it measured faster from 2048 queries on (H100, B·N² fixed,
# the backward alone, two runs): relu +4% at 2048², +7% at 4096², silu
# +2% / +3.5%, hardswish +4% / +4%; level or slower at 1152² and 1536² (up to 4% more padded rows), and for gelu_tanh's
# fp32 form (-1% to -4%), identity (+1-2%), relu_square, leaky_relu and sigmoid (-1% to +2.5%), which keep 64 rows.
# gelu_tanh's packed bf16x2 form (``activation_math.PackedBackwardForm``) left registers enough for the 80-row tiles
# to gain (H100, medians of four alternating rounds, whole backward: 2048² 11.73 -> 11.39 ms, 4096² 10.76 -> 10.36;
# 1536² level, 1152² 2% slower)
QUERY_TILES = config.QUERY_TILES
LONG_QUERY_TILE = 80
LONG_QUERY_TILE_HEAD_DIM = 128
# gelu's erf polynomial beside the 80-row tiles' accumulators: ptxas serializes every wgmma of the build (72 bytes
# spilled); the other activations spill 0-56 bytes (hardswish the most), none serializes
LONG_QUERY_TILE_EXCLUDED = ("gelu",)
LONG_QUERY_TILE_ACTIVATIONS = ("relu", "silu", "hardswish")
LONG_QUERY_TILE_PACKED_ACTIVATIONS = ("gelu_tanh",)
LONG_QUERY_TILE_MIN_QUERIES = 2048


def packed_backward(dtype: torch.dtype, activation: str, head_dim: int, head_dim_v: int, score_offset: bool,
                    score_bias: bool) -> bool:
    """Whether the backward takes ``activation``'s packed bf16x2 form (``activation_math.PackedBackwardForm``): where
    it has one, for bf16 operands without a bias, in the kernel of narrow heads."""
    from .activation_math import PACKED_BF16_BACKWARD_ACTIVATIONS

    return (dtype == torch.bfloat16 and activation in PACKED_BF16_BACKWARD_ACTIVATIONS
            and max(head_dim, head_dim_v) <= NARROW_MAX_HEAD_DIM and not (score_offset or score_bias))


def _long_query_tile_case(dq_sums: str, head_dim: int, head_dim_v: int, masked: bool, score_bias: bool,
                          activation: str) -> bool:
    return (dq_sums == "fp32" and head_dim == head_dim_v == LONG_QUERY_TILE_HEAD_DIM and not (masked or score_bias)
            and activation not in LONG_QUERY_TILE_EXCLUDED)


def _leading(bias_shape) -> tuple[int, int]:
    """(Zb, Hb) of a bias of ``bias_shape`` ([Zb, Hb, rows, columns] or fewer leading dims)."""
    return ((1, 1) + tuple(bias_shape[:-2]))[-2:]


def preferred_dbias_sums(bias_shape, num_samples: int, varlen: bool) -> str:
    """How dbias is summed where memory allows (one of ``DBIAS_SUMS``): atomically for a varlen batch's bias shared by
    its samples (HSTU's relative bias: the buffer holds every sample at the longest's size, zero-filled; H200, causal
    silu, B = 1152, H = 4, forward+backward with dbias 1.13-1.63x faster), stored otherwise: a dense batch's buffer
    holds only real scores and needs no fill where every tile is written, and there forward+backward with the adds
    measured 5% slower (512²), level (1024²) and 37% slower (2048², its fp32 sums past L2; a bias per sample, 1024²:
    19% slower)."""
    return "atomic" if varlen and _leading(bias_shape)[0] < num_samples else "buffer"


def _padded(n: int, tile: int) -> int:
    return -(-n // tile) * tile


def dbias_buffer_bytes(sums: str, num_samples: int, num_heads: int, bias: torch.Tensor) -> int:
    """Bytes of the tensor the CuTe backward sums dbias in (``sums``: one of ``DBIAS_SUMS``): a dS buffer of every
    (sample, head) in the bias's dtype, or the fp32 sums at the bias's size, rows and columns padded to whole tiles."""
    rows, cols = bias.shape[-2:]
    if sums == "atomic":
        zb, hb = _leading(bias.shape)
        return zb * hb * _padded(cols, KEY_TILE) * _padded(rows, QUERY_TILE) * 4
    return num_samples * num_heads * rows * _padded(cols, TMA_COLUMNS) * bias.element_size()


def dbias_sums_for(num_samples: int, num_heads: int, bias: torch.Tensor, varlen: bool = False,
                   spare: int | None = None) -> tuple[str | None, str]:
    """(way, reason): how the CuTe backward sums dbias of ``bias`` over ``num_samples`` x ``num_heads`` CTAs' dS.
    ``preferred_dbias_sums``' way where its tensor (``dbias_buffer_bytes``) takes at most half of what the device
    can still allocate, else the other where that one does, else None and why: then Triton's backward runs, which
    adds dbias by atomics into at most 1 GiB of slices. A dS buffer of every (sample, head) is the backward's
    largest tensor (a varlen batch's holds every sample at the longest's size: 39 GB for HSTU at B = 1152, N = 2048,
    H = 4), which a caller may not have budgeted for. ``spare``: the bytes to hold it against (None:
    ``spare_device_bytes`` of a CUDA bias; a bias elsewhere runs no CuTe kernel, and takes the preferred way)."""
    first = preferred_dbias_sums(bias.shape, num_samples, varlen)
    ways = (first, *(w for w in DBIAS_SUMS if w != first))
    if spare is None:
        if bias.device.type != "cuda":
            return first, ""
        spare = spare_device_bytes(bias.device)
    needs = [dbias_buffer_bytes(w, num_samples, num_heads, bias) for w in ways]
    for way, need in zip(ways, needs):
        if 2 * need <= spare:
            return way, ""
    sizes = ", ".join(f"{w} {n / 2**30:.1f} GiB" for w, n in zip(ways, needs))
    return None, (f"the CuTe backward's tensors for dbias ({sizes}) each take more than half the memory the device "
                  f"can still allocate ({spare / 2**30:.1f} GiB)")


def dbias_buffer(sums: str, num_samples: int, num_heads: int, bias: torch.Tensor, zeros: bool) -> torch.Tensor:
    """The tensor the CuTe backward sums dbias of ``bias`` ([Zb, Hb, rows, columns] or fewer leading dims) in
    (``sums``: one of ``DBIAS_SUMS``): the zero-filled fp32 sums, transposed (the kernel's (rows, columns, Hb, Zb)
    mode order, ``dense_modes``, then has the columns as rows and adds two neighbouring queries at once), or a
    [Z, H, rows, columns] dS buffer in the bias's dtype, zero-filled where ``zeros`` (where no CTA may store)."""
    rows, cols = bias.shape[-2:]
    if sums == "atomic":
        zb, hb = _leading(bias.shape)
        return torch.zeros((zb, hb, _padded(cols, KEY_TILE), _padded(rows, QUERY_TILE)), dtype=torch.float32,
                           device=bias.device)
    # rows padded for the TMA stores, seen as the bias's columns
    buffer = (torch.zeros if zeros else torch.empty)((num_samples, num_heads, rows, _padded(cols, TMA_COLUMNS)),
                                                     dtype=bias.dtype, device=bias.device)
    return buffer[..., :cols]


def dbias_way(dbias_sums: str | None, num_samples: int, num_heads: int, bias: torch.Tensor, varlen: bool) -> str:
    """The launchers' way of summing dbias: ``dbias_sums`` (one of ``DBIAS_SUMS``) where given, else the way
    ``dbias_sums_for`` finds fits (what dispatch checked; a direct call that skipped the check: the buffer)."""
    sums = dbias_sums or dbias_sums_for(num_samples, num_heads, bias, varlen)[0] or "buffer"
    if sums not in DBIAS_SUMS:
        raise ValueError(f"dbias_sums must be one of {DBIAS_SUMS}, got {dbias_sums!r}")
    return sums


def bwd_bias_support(check: tuple[bool, str], bias, q: torch.Tensor, v: torch.Tensor,
                     bias_grad: bool, samples_heads: tuple[int, int] = (1, 1),
                     varlen: bool = False) -> tuple[bool, str]:
    """A forward support check's (ok, reason) on the operands and their bias (dense: in its 4-D form), narrowed to
    the backward's biases (one element, or a tensor ``bias_tensor_bwd_support`` takes) and bias gradients (of a
    tensor only, summed in a tensor that fits, ``dbias_sums_for``; ``samples_heads``: the batch's (Z or B, H),
    ``varlen``: whether it is a varlen batch)."""
    if not check[0] or bias is None:
        return check
    if not _is_tensor_bias(bias):
        return (False, "the CuTe backward computes the gradient of a bias tensor only") if bias_grad else check
    ok, reason = bias_tensor_bwd_support(bias, q, v)
    if ok and bias_grad:
        way, reason = dbias_sums_for(*samples_heads, bias, varlen)
        return way is not None, reason
    return ok, reason


def bwd_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: str,
                  bias_grad: bool = False):
    """(ok, reason) for the CuTe backward on [Z, H, N, D] operands (a bias in the 4-D form): the forward's cases at
    the backward's head dims, a bias tensor where ``bias_tensor_bwd_support`` takes it, a bias gradient
    (``bias_grad``: whether the call wants one) of a bias tensor."""
    check = _within_bwd_head_dims(fwd_supported(q, k, v, bias, causal, activation), q, v)
    return bwd_bias_support(check, bias, q, v, bias_grad, q.shape[:2])


def cute_bwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: str,
                     bias_grad: bool = False):
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting): the forward's cases, its
    causal mask and biases included (``causal_support``, ``score_bias_support``), at the backward's head dims, as
    ``bwd_supported`` narrows them."""
    check = _within_bwd_head_dims(cute_fwd_support(q, k, v, bias, causal, activation), q, v)
    if not check[0] or bias is None:
        return bwd_bias_support(check, bias, q, v, bias_grad)
    (q4, _, v4), batch = _as_4d(q, k, v)
    return bwd_bias_support(check, _bias_4d(bias, batch, q4.shape[2]), q4, v4, bias_grad, q4.shape[:2])


def compile_bwd(
    dtype: torch.dtype, head_dim: int, activation: str, keep_ptx: bool = False,
    dq_sums: str = "fp32", head_dim_v: int | None = None, varlen: bool = False, causal: bool = False,
    band: bool = False, score_offset: bool = False, score_bias: bool = False, bias_grad: bool = False,
    dbias_atomic: bool = False, query_tile: int = QUERY_TILE, dq_last_round: bool = False,
):
    """The compiled backward for (dtype, head dims, activation, ``dq_sums``: one of ``DQ_SUMS``, varlen or
    not, causal or not), cached in memory and on disk (``compile_cache``); sizes and strides are runtime values.
    Compiled against fake tensors (``kernel_args``); called with the seven tensors in the kernel's mode order, the
    three scalars and, varlen, the (5, B) rows tensor and the longest sample's key tiles. ``head_dim_v``: V's and
    dO's head dim (None: ``head_dim``). ``causal``: the bottom-right aligned mask (``causal_support``'s cases, or
    varlen ``varlen_causal_support``'s), dQ not summed by pairs. ``band`` (varlen): the mask of a band around each
    sample's diagonal, its bounds the call's arguments after the rows. ``score_offset``: a one-element bias, the
    call's argument after the varlen and band arguments (Nones where it lacks them; ``GdpaBwdSm90``).
    ``score_bias``: a bias tensor (``bias_tensor_bwd_support``; D and Dv at most 128), in the call after the
    one element's place, and ``bias_grad``: dS stored into a [Z, H, Nq, Nk] tensor (varlen: [B, H, the bias's rows
    and columns]), the call's last argument; every call passes those two (Nones where it has none). ``dbias_atomic``:
    dS added instead into an fp32 tensor of the bias's size (``dbias_buffer``). ``query_tile``: queries per step, one of
    ``QUERY_TILES`` (80: ``bwd_query_tile``'s cases, dQ's fp32 sums in ``dq_of_fragments``' order).
    ``dq_last_round`` (``dq_last_round_for``'s cases): the kernel rounds dQ itself (module ``dq_last_round``), into
    the call's dQ in the operands' dtype, with one zero-filled int32 count per (sample, head): its two last arguments
    (Nones in every other call); it leaves the sums and the counts zero (``dq_workspace``)."""
    if dq_sums not in DQ_SUMS:
        raise ValueError(f"dq_sums must be one of {DQ_SUMS}, got {dq_sums!r}")
    if varlen and dq_sums == "pairs":
        raise ValueError("dq_sums='pairs' is not available for varlen batches")
    if causal and dq_sums == "pairs":
        raise ValueError("the causal CuTe backward takes dq_sums 'in_place' or 'fp32'")
    if band and not varlen:
        raise ValueError("band=True needs varlen=True (the band mask is in the varlen kernels)")
    if bias_grad and not score_bias:
        raise ValueError("bias_grad=True needs score_bias=True (the gradient of a bias tensor)")
    if dbias_atomic and not bias_grad:
        raise ValueError("dbias_atomic=True needs bias_grad=True")
    if score_bias and (score_offset or dq_sums == "pairs"):
        raise ValueError("score_bias=True: no one-element bias, dq_sums other than 'pairs'")
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    if query_tile not in QUERY_TILES:
        raise ValueError(f"query_tile must be one of {QUERY_TILES}, got {query_tile!r}")
    if query_tile != QUERY_TILE and not _long_query_tile_case(dq_sums, head_dim, head_dim_v, varlen or causal or band,
                                                              score_bias, activation):
        raise ValueError(f"query_tile={query_tile} needs dq_sums='fp32', D = Dv = {LONG_QUERY_TILE_HEAD_DIM}, no "
                         f"mask, no bias tensor, a dense batch and an activation other than {LONG_QUERY_TILE_EXCLUDED}")
    if dq_last_round and not dq_last_round_for(dq_sums, head_dim, head_dim_v, varlen):
        raise ValueError(f"dq_last_round=True needs dq_sums='fp32', a dense batch and D, Dv <= {NARROW_MAX_HEAD_DIM}")
    wide = max(head_dim, head_dim_v) > NARROW_MAX_HEAD_DIM
    if wide and (causal or band or dq_sums == "pairs" or score_bias):
        raise ValueError(f"the wide-head backward (D={head_dim}, Dv={head_dim_v}) takes no mask, no dQ pairs and no "
                         "bias tensor")
    key = ("bwd", str(dtype), head_dim, head_dim_v, activation, dq_sums, keep_ptx, varlen)
    if causal:
        key = (*key, "causal")
    if band:
        key = (*key, "band")
    if score_offset:
        key = (*key, "offset")
    if score_bias:
        key = (*key, ("dbias_atomic" if dbias_atomic else "bias_grad") if bias_grad else "bias")
    if query_tile != QUERY_TILE:
        key = (*key, f"query_tile{query_tile}")
    if dq_last_round:
        key = (*key, "dq_last_round")

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
        extra += [None] * (4 - len(extra)) + [fake_offset() if score_offset else None]
        # the bias tensor and dBias, in the operands' (N, D, H, Z) form: (Nq, Nk, H, Z)
        extra += [fake_operands(element, 1)[0] if score_bias else None]
        extra += [fake_operands(cutlass.Float32 if dbias_atomic else element, 1)[0] if bias_grad else None]
        extra += [fake_operands(element, 1)[0], fake_counts()] if dq_last_round else [None, None]
        one = cutlass.Float32(1.0)
        # the band masks every query tile, which the packed forms leave to their fp32 twins: the fp32 form
        form = activation_math.backward_form(
            activation, packed_backward(dtype, activation, head_dim, head_dim_v, score_offset, score_bias) and not band)
        if wide:
            kernel = GdpaBwdWideSm90(element, head_dim, head_dim_v, form, dq_element, varlen=varlen,
                                     score_offset=score_offset)
        else:
            kernel = GdpaBwdSm90(
                element, head_dim, head_dim_v, form, dq_element, dq_pairs=dq_sums == "pairs",
                dq_late=dq_late_for(dq_sums, head_dim, head_dim_v), varlen=varlen, causal=causal, band=band,
                score_offset=score_offset, score_bias=score_bias, bias_grad=bias_grad, dbias_atomic=dbias_atomic,
                tile_m=query_tile, dq_last_round=dq_last_round,
            )
        return cute.compile(kernel, *args, one, one, one, fake_stream(), *extra, options=compile_options(keep_ptx))

    return cached_compile(key, build, persist=not keep_ptx)


def dq_last_round_for(dq_sums: str, head_dim: int, head_dim_v: int, varlen: bool = False) -> bool:
    """Whether the backward can round dQ itself (module ``dq_last_round``; ``GdpaBwdSm90``'s ``dq_last_round``), the
    launcher's default wherever it can: dQ summed in fp32, a dense batch, D and Dv at most ``NARROW_MAX_HEAD_DIM``.
    On H100 the whole backward measured 1.6-5.6% faster at 2048² than with a pass after it."""
    return dq_sums == "fp32" and not varlen and max(head_dim, head_dim_v) <= NARROW_MAX_HEAD_DIM


def dq_late_for(dq_sums: str, head_dim: int, head_dim_v: int) -> bool:
    """Whether the backward computes dQ one query tile late (``GdpaBwdSm90``'s ``dq_late``): everywhere but
    where dQ is summed in place at D = Dv = 128, where the warpgroups meeting every tile measured 2-5% faster
    (H200, 512² to 1024²); with fp32 sums one tile late is 3-5% faster with gelu_tanh at
    1024² and 2048², level with silu at 2048²."""
    return not (dq_sums == "in_place" and head_dim == head_dim_v == 128)


# The pairs are not taken by default: with the activation's factors out of the per-score work
# (activation_math.backward_form) they do not beat the fp32 buffer past the noise (H200, gelu_tanh, bwd TF/s,
# fp32 -> pairs, benchmarks/bench_dq_sums.py --only-head-dims): at D = Dv = 128 470 -> 475 (1280 keys), 476 -> 485
# (1536), 499 -> 495 (2048; a same-process A/B at 2048: 509-518 -> 493-497); at every other head dim they lose 4-13%.
def dq_sums_for(num_keys: int, key_tile: int = KEY_TILE) -> str:
    """How dQ is summed over ``num_keys`` keys in CTAs of ``key_tile`` keys by default (one of ``DQ_SUMS``): in
    place in the operands' dtype up to ``DQ_DIRECT_MAX_KEY_TILES`` roundings, else in fp32."""
    return "in_place" if -(-num_keys // key_tile) <= DQ_DIRECT_MAX_KEY_TILES else "fp32"


def gdpa_bwd_cute(
    q, k, v, grad_out, activation: str, scale: float, post_scale: float, negative_slope: float,
    dq_sums: str | None = None, causal: bool = False, bias: torch.Tensor | None = None, bias_grad: bool = False,
    dbias_sums: str | None = None, query_tile: int | None = None, one_row_bias: bool = False,
    dq_last_round: bool | None = None,
):
    """q [Z, H, Nq, D], k [Z, Hkv, Nk, D], v [Z, Hkv, Nk, Dv], grad_out [Z, H, Nq, Dv] (``bwd_supported``
    checked) -> (dq, dk, dv, dbias or None).
    ``dq_sums``: one of ``DQ_SUMS`` (None: ``dq_sums_for`` decides by the key count; "pairs" needs an even
    number of key tiles, no ``causal`` and no bias tensor). ``causal``: the bottom-right aligned mask. ``bias``: one
    element (any float dtype), added to every score (no gradient), or a tensor ``bias_tensor_bwd_support`` takes
    ([Zb, Hb, Nq, Nk], Zb 1 or Z, Hb 1 or H), added to each; ``bias_grad``: its gradient is wanted (a tensor's
    only), dbias in its shape and dtype, summed as ``dbias_sums`` says (one of ``DBIAS_SUMS``; None:
    ``dbias_sums_for``). ``query_tile``: one of ``QUERY_TILES`` (None: ``bwd_query_tile``). ``one_row_bias``: the
    bias is one row seen as Nq rows of stride 0 (``_bias_4d``), dbias that row's, summed over the queries (a bias
    tensor the caller expanded itself gets one gradient per row). ``dq_last_round``: the kernel rounds dQ itself
    (``dq_last_round``; None: ``dq_last_round_for``) from sums kept zeroed between calls (``dq_workspace``), else one
    pass after it."""
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
    tensor_bias = bias if _is_tensor_bias(bias) else None
    if bias_grad and tensor_bias is None:
        raise ValueError("bias_grad=True needs a bias tensor (the CuTe backward's bias gradient is a tensor's)")
    offset = None if tensor_bias is not None else bias
    direct = dq_sums != "fp32"
    if query_tile is None:
        packed = packed_backward(q.dtype, activation, d, d_v, offset is not None, tensor_bias is not None)
        query_tile = bwd_query_tile(dq_sums, d, d_v, causal, tensor_bias is not None, activation, nq, packed)
    # 80-row tiles: the fp32 sums in whole tiles, in the kernel's order (``dq_of_fragments``)
    dq_rows = nq if query_tile == QUERY_TILE else _padded(nq, query_tile)
    dq_last_round = dq_last_round_for(dq_sums, d, d_v) if dq_last_round is None else dq_last_round
    dq_out, counts = None, None
    if dq_last_round:
        # the kernel leaves the sums and counts zero again: kept between calls, no zero fill
        dq_acc, counts = zeroed_dq_sums((z, h, dq_rows, d), z * h, q.device)
        dq_out = torch.empty((z, h, nq, d), dtype=q.dtype, device=q.device)
    else:
        dq_acc = torch.zeros((z, h, dq_rows, d), dtype=q.dtype if direct else torch.float32, device=q.device)
    dk = torch.empty((z, h, nk, d), dtype=q.dtype, device=q.device)
    dv = torch.empty((z, h, nk, d_v), dtype=q.dtype, device=q.device)
    ds, sums = None, None
    if bias_grad:
        sums = dbias_way(dbias_sums, z, h, tensor_bias, varlen=False)
        # a causal CTA skips the query tiles before its diagonal, whose dS is zero
        ds = dbias_buffer(sums, z, h, tensor_bias, zeros=causal)
    if dq_acc.numel() and dk.numel():
        fn = compile_bwd(q.dtype, d, activation, dq_sums=dq_sums, head_dim_v=d_v, causal=causal,
                         score_offset=offset is not None, score_bias=tensor_bias is not None, bias_grad=bias_grad,
                         dbias_atomic=sums == "atomic", query_tile=query_tile, dq_last_round=dq_last_round)
        # no rows, no key-tile count, no band: a dense batch; then the one-element bias, the bias tensor and dS, or
        # Nones (a function loaded from the disk cache fills in no defaults)
        fn(*(dense_modes(t) for t in (q, k, v, grad_out, dq_acc, dk, dv)), scale, post_scale, negative_slope, None,
           None, None, None, *offset_args(offset), None if tensor_bias is None else bias_tile_modes(tensor_bias),
           None if ds is None else dense_modes(ds), None if dq_out is None else dense_modes(dq_out), counts)
    else:
        dk.zero_()
        dv.zero_()
        if dq_out is not None:
            dq_out.zero_()
        if ds is not None:
            ds.zero_()
    if direct:
        dq = dq_acc
    elif dq_out is not None:
        dq = dq_out
    elif query_tile == QUERY_TILE:
        dq = dq_of_sums(dq_acc, q.dtype, activation, scale, post_scale)
    else:
        dq = dq_of_fragments(dq_acc, nq, q.dtype, activation, scale, post_scale, query_tile)
    if group > 1:
        dk = dk.view(z, hkv, group, nk, d).sum(2)
        dv = dv.view(z, hkv, group, nk, d_v).sum(2)
    dbias = None if ds is None else dbias_of(ds, tensor_bias, sums, activation, post_scale, one_row_bias)
    return dq, dk, dv, dbias


def _ds_factor(activation: str, scale: float, post_scale: float) -> float:
    """dS's scale: scale, post_scale and act''s constant factor, multiplied in fp32 as the kernel multiplies them for
    dK."""
    from .activation_math import backward_form

    factor = torch.tensor(scale, dtype=torch.float32) * torch.tensor(post_scale, dtype=torch.float32)
    return (factor * backward_form(activation).grad_factor).item()


def dq_of_sums(sums: torch.Tensor, dtype: torch.dtype, activation: str, scale: float,
               post_scale: float) -> torch.Tensor:
    """dQ in ``dtype`` from the kernel's fp32 sums, which it leaves unscaled: times dS's scale (``_ds_factor``),
    rounded once, in one pass (``dq_round``'s Triton pass on a GPU, torch elsewhere: the same arithmetic)."""
    factor = _ds_factor(activation, scale, post_scale)
    out = torch.empty(sums.shape, dtype=dtype, device=sums.device)
    if sums.is_cuda and sums.is_contiguous():
        return dq_round.scale_round_triton(sums, out, factor)
    return torch.mul(sums, factor, out=out)


def dq_fragments_as_rows(sums: torch.Tensor, query_tile: int = LONG_QUERY_TILE) -> torch.Tensor:
    """A copy as [Z, H, rows, D] rows of D of the fp32 sums of the backward with ``query_tile``-row tiles
    (``GdpaBwdSm90``'s ``dq_flat``), which hold each tile's dQᵀ in the accumulators' order (``dq_fragments``'
    comment): per tile, per warpgroup's half of D, per group of four values (j), per thread, its four values
    (c + 2 r)."""
    z, h, rows, d = sums.shape
    halves, js = d // dq_fragments.ACC_ROWS, query_tile // dq_fragments.ACC_COLUMNS_PER_J
    # (tile, half, j, w, g, t, r, c) -> (tile, j, t, c | half, w, r, g): query 8 j + 2 t + c of the tile, D's
    # 64 half + 16 w + 8 r + g
    frags = sums.view(z, h, rows // query_tile, halves, js, dq_fragments.ACC_WARPS, dq_fragments.ACC_ROW_GROUPS,
                      dq_fragments.ACC_COL_PAIRS, 2, 2)
    return frags.permute(0, 1, 2, 4, 7, 9, 3, 5, 8, 6).reshape(z, h, rows, d)


def dq_of_fragments(sums: torch.Tensor, num_queries: int, dtype: torch.dtype, activation: str, scale: float,
                    post_scale: float, query_tile: int = LONG_QUERY_TILE) -> torch.Tensor:
    """dQ [Z, H, Nq, D] in ``dtype`` from the fp32 sums of the backward with ``query_tile``-row tiles
    (``dq_fragments_as_rows``), scaled by dS's scale (``_ds_factor``) and rounded once: one Triton pass on a GPU
    (``dq_fragments``), the torch permute elsewhere."""
    z, h, _, d = sums.shape
    factor = _ds_factor(activation, scale, post_scale)
    out = torch.empty((z, h, num_queries, d), dtype=dtype, device=sums.device)
    if sums.is_cuda:
        return dq_fragments.dq_of_fragments_triton(sums, out, factor, query_tile)
    return torch.mul(dq_fragments_as_rows(sums, query_tile)[:, :, :num_queries], factor, out=out)


def bwd_query_tile(dq_sums: str, head_dim: int, head_dim_v: int, causal: bool, score_bias: bool,
                   activation: str, num_queries: int, packed: bool = False) -> int:
    """Queries per step of the backward (one of ``QUERY_TILES``) for a dense batch of ``num_queries`` queries: where
    ``config.cute_bwd_query_tile`` (``GDPA_CUTE_BWD_QUERY_TILE``) names one, that one in its cases; else 80 in its cases
    for ``LONG_QUERY_TILE_ACTIVATIONS`` (and with ``packed``, the backward in its packed form, for
    ``LONG_QUERY_TILE_PACKED_ACTIVATIONS``) from ``LONG_QUERY_TILE_MIN_QUERIES`` on, 64 otherwise (``QUERY_TILES``'
    comment)."""
    wanted = config.cute_bwd_query_tile
    if wanted is None:
        long_tile_activations = LONG_QUERY_TILE_ACTIVATIONS + (LONG_QUERY_TILE_PACKED_ACTIVATIONS if packed else ())
        preferred = activation in long_tile_activations and num_queries >= LONG_QUERY_TILE_MIN_QUERIES
        wanted = LONG_QUERY_TILE if preferred else QUERY_TILE
    if int(wanted) != QUERY_TILE and _long_query_tile_case(dq_sums, head_dim, head_dim_v, causal, score_bias,
                                                           activation):
        return int(wanted)
    return QUERY_TILE


def dbias_of(ds: torch.Tensor, bias: torch.Tensor, sums: str, activation: str, post_scale: float,
             one_row: bool = False) -> torch.Tensor:
    """dBias of ``bias`` ([Zb, Hb, Nq, Nk] or fewer leading dims) from ``dbias_buffer``'s tensor for ``sums``, filled
    by the kernel without act''s constant factor and post_scale (dK and dQ take them at the end): the fp32 sums
    transposed back, scaled and rounded once, or the [Z, H, Nq, Nk] dS buffer summed (``_sum_to``) and scaled.
    ``one_row``: the bias is one row seen as Nq rows (``_bias_4d``): its one row's gradient, summed over the queries
    before the one rounding."""
    from .activation_math import backward_form

    factor = post_scale * backward_form(activation).grad_factor
    rows, cols = bias.shape[-2:]
    if one_row:
        bias = bias[..., :1, :]
    shape4 = (1,) * (4 - bias.dim()) + tuple(bias.shape)
    if sums == "atomic":
        totals = ds[..., :cols, :rows].transpose(-1, -2)
        totals = totals.sum(-2, keepdim=True) if one_row else totals
        return torch.empty(shape4, dtype=bias.dtype, device=ds.device).copy_(totals.mul(factor)).view(bias.shape)
    return _sum_to(ds, shape4).mul_(factor).reshape(bias.shape).contiguous()


def bias_tile_modes(bias: torch.Tensor) -> torch.Tensor:
    """A [Zb, Hb, Nq, Nk] bias (or fewer leading dims) ``bias_tensor_bwd_support`` takes -> the kernel's
    (Nq, Nk, Hb, Zb) mode order (a view of it, or of ``tma_bias``' padded copy), its size-1 dims given a stride TMA
    takes (never stepped along: any multiple of 16 bytes does)."""
    bias = tma_bias(bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)))
    placeholder = _padded(bias.shape[-1], TMA_COLUMNS)
    b = torch.as_strided(bias, bias.shape, [s if n > 1 else placeholder for n, s in
                                            zip(bias.shape[:-1], bias.stride()[:-1])] + [1])
    return dense_modes(b)


def _sum_to(ds: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """[Z, H, Nq, Nk] dS summed over the dims a bias of ``shape`` ([Zb, Hb, Nq, Nk]) broadcasts along, accumulated in
    fp32 and rounded once to dS's dtype (dS itself where it broadcasts along none; the caller's scale rounds again).
    dS is the backward's largest tensor: with an fp32 sum, scale and cast in its place the backward with dbias ran
    4-7% slower (H200, bias per sample, 1024² to 2048²)."""
    dims = [i for i, (n, m) in enumerate(zip(shape, ds.shape)) if n == 1 and m > 1]
    return ds.sum(dims, keepdim=True) if dims else ds


def gdpa_bwd_cute_batched(grad_out, q, k, v, activation: str, scale: float, post_scale: float, negative_slope: float,
                          causal: bool = False, bias: torch.Tensor | None = None, bias_grad: bool = False):
    """The op's backward on the CuTe kernel: [..., H, N, D] operands of one batch shape (``cute_bwd_support``
    checked: no broadcast dims) -> (dq, dk, dv, dbias or None) in the inputs' shapes."""
    (q4, k4, v4), batch = _as_4d(q, k, v)
    do4 = grad_out.reshape(*q4.shape[:3], v4.shape[-1])
    bias4 = _bias_4d(bias, batch, q4.shape[2])
    one_row = _is_tensor_bias(bias) and (bias.dim() < 2 or bias.shape[-2] == 1) and q4.shape[2] > 1
    dq, dk, dv, dbias = gdpa_bwd_cute(q4, k4, v4, do4, activation, scale, post_scale, negative_slope, causal=causal,
                                      bias=bias4, bias_grad=bias_grad, one_row_bias=one_row)
    if dbias is not None:
        # a bias whose batch dims flattened only by a copy (``_bias_4d``) got one gradient per sample
        dbias = dbias.view(bias.shape) if dbias.numel() == bias.numel() else dbias.reshape(
            *batch, *dbias.shape[1:]).sum_to_size(bias.shape)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), dbias
