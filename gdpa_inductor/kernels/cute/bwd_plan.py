"""How the CuTe-DSL Hopper backward runs a call: how dQ is summed, the query tile, the activation's form and the
kernel (narrow or wide heads), each decision with the measurement behind it, frozen in a ``BwdPlan`` that is also
the compile key."""

from __future__ import annotations

import dataclasses
import functools

import torch

from ... import config
from ..activations import PACKED_BF16_BACKWARD, ActivationName, with_long_query_tile
from .fwd_plan import check_element, persistent_grid

# Up to this many key tiles (128 keys; 64 in the wide-head kernel), dQ tiles are added straight into dQ in the
# operands' dtype: the fp32 buffer's zero fill, its reduce traffic and the cast cost 20-30% of the backward at
# 256-1024 keys. Each dQ value then takes one rounding per key tile plus one per sum: on H200 its error measured
# 0.8-1.24x eager PyTorch's own at 512 keys and 0.98-1.52x at 1024 (fp32 sums: 0.5-0.8x), growing as
# sqrt(tiles), so longer ranges keep fp32 (the bound is 2x eager's).
DQ_DIRECT_MAX_KEY_TILES = 8
KEY_TILE = 128

# How the backward sums dQ over key tiles: in place in the operands' dtype, one rounding per key tile
# ("in_place"), or in an fp32 buffer cast at the end ("fp32").
DQ_SUMS = ("in_place", "fp32")


# Each consumer warpgroup of GdpaBwdSm90 keeps dK and dV of its 64 keys in registers, (D + Dv) / 2 fp32 values a
# thread (128 at D = Dv = 128): larger head dims leave no room for the scores, so past NARROW_MAX_HEAD_DIM the
# wide-head kernel (GdpaBwdWideSm90: 64-key CTAs, every matmul split between the warpgroups) runs instead
NARROW_MAX_HEAD_DIM = 128
WIDE_KEY_TILE = 64


def bwd_key_tile(head_dim: int, head_dim_v: int) -> int:
    """Keys per CTA of the backward for these head dims."""
    return WIDE_KEY_TILE if max(head_dim, head_dim_v) > NARROW_MAX_HEAD_DIM else KEY_TILE


QUERY_TILE = 64

# Queries per step of GdpaBwdSm90: 64, or 80 (flash-attn's tile at D = 128: a fifth fewer steps, K and V read a fifth
# less often per FLOP) where dQ is summed in fp32 at D = Dv = 128 without a mask or bias tensor in a dense batch.
# Taken by default for the activations whose backward it measured faster from 2048 queries on (H100, B·N² fixed,
# the backward alone, two runs; level or slower at 1152² and 1536², up to 4% more padded rows), never for some: the
# activation table's ``long_query_tile``, with each activation's measurements.
QUERY_TILES = config.QUERY_TILES
LONG_QUERY_TILE = 80
LONG_QUERY_TILE_HEAD_DIM = 128
LONG_QUERY_TILE_EXCLUDED = with_long_query_tile("never")
LONG_QUERY_TILE_ACTIVATIONS = with_long_query_tile("by_default")
LONG_QUERY_TILE_PACKED_ACTIVATIONS = with_long_query_tile("by_default_packed")
LONG_QUERY_TILE_MIN_QUERIES = 2048


def packed_backward(dtype: torch.dtype, activation: ActivationName, head_dim: int, head_dim_v: int, score_offset: bool,
                    score_bias: bool) -> bool:
    """Whether the backward takes ``activation``'s packed bf16x2 form (``activation_math.PackedBackwardForm``): where
    it has one, for bf16 operands without a bias, in the kernel of narrow heads."""
    return (dtype == torch.bfloat16 and activation in PACKED_BF16_BACKWARD
            and max(head_dim, head_dim_v) <= NARROW_MAX_HEAD_DIM and not (score_offset or score_bias))


def _long_query_tile_case(dq_sums: str, head_dim: int, head_dim_v: int, masked: bool, score_bias: bool,
                          activation: ActivationName) -> bool:
    return (dq_sums == "fp32" and head_dim == head_dim_v == LONG_QUERY_TILE_HEAD_DIM and not (masked or score_bias)
            and activation not in LONG_QUERY_TILE_EXCLUDED)


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


def dq_sums_for(num_keys: int, key_tile: int = KEY_TILE) -> str:
    """How dQ is summed over ``num_keys`` keys in CTAs of ``key_tile`` keys by default (one of ``DQ_SUMS``): in
    place in the operands' dtype up to ``DQ_DIRECT_MAX_KEY_TILES`` roundings, else in fp32."""
    return "in_place" if -(-num_keys // key_tile) <= DQ_DIRECT_MAX_KEY_TILES else "fp32"


def bwd_query_tile(dq_sums: str, head_dim: int, head_dim_v: int, causal: bool, score_bias: bool,
                   activation: ActivationName, num_queries: int, packed: bool = False) -> int:
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


@dataclasses.dataclass(frozen=True)
class BwdPlan:
    """One build of the backward (``GdpaBwdSm90``, or ``GdpaBwdWideSm90`` past head dims of 128) and why it is
    shaped so: the plan is the compile key (every field but ``reason``). ``dq_sums``: one of ``DQ_SUMS``;
    ``band`` (varlen): the band around each sample's diagonal; ``score_offset``: a one-element bias;
    ``score_bias``: a bias tensor, ``bias_grad``: its gradient wanted (dS stored per (sample, head), or added in
    fp32 at the bias's size: ``dbias_atomic``); ``query_tile``: one of ``QUERY_TILES`` (80 in ``bwd_query_tile``'s
    cases, dQ's fp32 sums then in ``dq_of_fragments``' order); ``dq_last_round``: the kernel rounds dQ itself
    (``dq_last_round_for``'s cases, module ``dq_last_round``)."""

    dtype: torch.dtype
    head_dim: int
    head_dim_v: int
    activation: ActivationName
    dq_sums: str = "fp32"
    varlen: bool = False
    causal: bool = False
    band: bool = False
    score_offset: bool = False
    score_bias: bool = False
    bias_grad: bool = False
    dbias_atomic: bool = False
    query_tile: int = QUERY_TILE
    dq_last_round: bool = False
    reason: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self):
        check_element(self, "the CuTe backward")
        if self.dq_sums not in DQ_SUMS:
            raise ValueError(f"dq_sums must be one of {DQ_SUMS}, got {self.dq_sums!r}")
        if self.band and not self.varlen:
            raise ValueError("band=True needs varlen=True (the band mask is in the varlen kernels)")
        if self.bias_grad and not self.score_bias:
            raise ValueError("bias_grad=True needs score_bias=True (the gradient of a bias tensor)")
        if self.dbias_atomic and not self.bias_grad:
            raise ValueError("dbias_atomic=True needs bias_grad=True")
        if self.score_bias and self.score_offset:
            raise ValueError("score_bias=True takes no one-element bias as well")
        if self.query_tile not in QUERY_TILES:
            raise ValueError(f"query_tile must be one of {QUERY_TILES}, got {self.query_tile!r}")
        if self.query_tile != QUERY_TILE and not _long_query_tile_case(
                self.dq_sums, self.head_dim, self.head_dim_v, self.varlen or self.causal or self.band,
                self.score_bias, self.activation):
            raise ValueError(f"query_tile={self.query_tile} needs dq_sums='fp32', D = Dv = {LONG_QUERY_TILE_HEAD_DIM}, "
                             f"no mask, no bias tensor, a dense batch and an activation other than "
                             f"{LONG_QUERY_TILE_EXCLUDED}")
        if self.dq_last_round and not dq_last_round_for(self.dq_sums, self.head_dim, self.head_dim_v, self.varlen):
            raise ValueError(f"dq_last_round=True needs dq_sums='fp32', a dense batch and D, Dv <= "
                             f"{NARROW_MAX_HEAD_DIM}")
        if self.wide and (self.causal or self.band or self.score_bias):
            raise ValueError(f"the wide-head backward (D={self.head_dim}, Dv={self.head_dim_v}) takes no mask and no "
                             "bias tensor")

    @property
    def wide(self) -> bool:
        """The wide-head kernel (``GdpaBwdWideSm90``) runs."""
        return max(self.head_dim, self.head_dim_v) > NARROW_MAX_HEAD_DIM

    @property
    def key_tile(self) -> int:
        return bwd_key_tile(self.head_dim, self.head_dim_v)

    @property
    def dq_late(self) -> bool:
        return dq_late_for(self.dq_sums, self.head_dim, self.head_dim_v)

    @property
    def packed(self) -> bool:
        """The activation's packed bf16x2 form (``packed_backward``); the band masks every query tile, which the
        packed forms leave to their fp32 twins: the fp32 form there."""
        return packed_backward(self.dtype, self.activation, self.head_dim, self.head_dim_v, self.score_offset,
                               self.score_bias) and not self.band



def plan_bwd(dtype: torch.dtype, head_dim: int, activation: ActivationName, head_dim_v: int | None = None, *,
             num_queries: int, num_keys: int, varlen: bool = False, causal: bool = False, band: bool = False,
             score_offset: bool = False, score_bias: bool = False, bias_grad: bool = False,
             dbias_atomic: bool = False) -> BwdPlan:
    """The backward's plan for a call of these head dims (None: Dv = D), ``num_queries`` queries and ``num_keys``
    keys (a varlen batch: its longest sample's), masks and bias: dQ's sums by ``dq_sums_for``, the query tile by
    ``bwd_query_tile`` (a dense batch), dQ rounded by the kernel where ``dq_last_round_for`` allows."""
    return _plan_bwd(dtype, head_dim, activation, head_dim_v, num_queries=num_queries, num_keys=num_keys, varlen=varlen,
                     causal=causal, band=band, score_offset=score_offset, score_bias=score_bias, bias_grad=bias_grad,
                     dbias_atomic=dbias_atomic, query_tile_setting=config.cute_bwd_query_tile)


# plans are pure functions of their arguments and the query-tile option (``query_tile_setting``, read by
# ``bwd_query_tile``), asked for at every launch
@functools.lru_cache(maxsize=4096)
def _plan_bwd(dtype: torch.dtype, head_dim: int, activation: ActivationName, head_dim_v: int | None, *,
              num_queries: int, num_keys: int, varlen: bool, causal: bool, band: bool, score_offset: bool,
              score_bias: bool, bias_grad: bool, dbias_atomic: bool, query_tile_setting: int | None) -> BwdPlan:
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    key_tile = bwd_key_tile(head_dim, head_dim_v)
    dq_sums = dq_sums_for(num_keys, key_tile)
    query_tile = QUERY_TILE
    if not varlen:
        packed = packed_backward(dtype, activation, head_dim, head_dim_v, score_offset, score_bias)
        query_tile = bwd_query_tile(dq_sums, head_dim, head_dim_v, causal, score_bias, activation, num_queries,
                                    packed)
    last_round = dq_last_round_for(dq_sums, head_dim, head_dim_v, varlen)
    tiles = -(-num_keys // key_tile)
    reason = (f"dQ summed in place over {tiles} key tiles (at most {DQ_DIRECT_MAX_KEY_TILES})" if dq_sums == "in_place"
              else f"dQ summed in fp32 over {tiles} key tiles (more than {DQ_DIRECT_MAX_KEY_TILES})")
    reason += f", {query_tile}-query steps" + (", rounded by the kernel" if last_round else "")
    if max(head_dim, head_dim_v) > NARROW_MAX_HEAD_DIM:
        reason += ", the wide-head kernel: a head dim past 128"
    return BwdPlan(dtype, head_dim, head_dim_v, activation, dq_sums=dq_sums, varlen=varlen, causal=causal, band=band,
                   score_offset=score_offset, score_bias=score_bias, bias_grad=bias_grad, dbias_atomic=dbias_atomic,
                   query_tile=query_tile, dq_last_round=last_round, reason=reason)


# --- the Blackwell backward (GdpaBwdSm100): no bias, D = Dv of 64 or 128 ---

SM100_BWD_HEAD_DIMS = (64, 128)
# 128-key CTAs, 128-row query tiles
SM100_BWD_TILE = 128
# shared memory a block may take on sm_100 (227 KB), less 2 KB for the barriers and the tiles' 1024-byte alignment
SM100_BWD_SMEM_BUDGET = 227 * 1024 - 2048


def sm100_bwd_q_stages(head_dim: int, element_bytes: int = 2) -> int:
    """Q/dO stages of the Blackwell backward: as many (Q, dO) tile pairs as fit beside K, V and dS, at most two (two
    at D = 128: 96 KB beside 2 x 64 KB)."""
    fixed = 2 * SM100_BWD_TILE * head_dim * element_bytes + SM100_BWD_TILE * SM100_BWD_TILE * element_bytes
    pair_bytes = 2 * SM100_BWD_TILE * head_dim * element_bytes
    return max(1, min(2, (SM100_BWD_SMEM_BUDGET - fixed) // pair_bytes))


@dataclasses.dataclass(frozen=True)
class Sm100BwdPlan:
    """One build of the Blackwell backward (``GdpaBwdSm100``), compiled for ``target``: the plan is the compile key
    (every field). ``mask_queries``: queries past Nq give P = dS = 0 (Nq not a multiple of the 128-row query tile);
    ``q_stages``: ``sm100_bwd_q_stages``; ``causal``: the bottom-right aligned causal mask; ``window``: a band
    (left, right bounds passed at launch) in its place; ``varlen``: per-sample rows (``ragged_rows``), every query
    tile masked past its sample's end; ``bias``: the bias tensor's element type by torch's name ("" for none; a
    16-bit one is the operands'); ``bias_grad``: its gradient's dS buffer written. dQ is summed unscaled in fp32
    (``bwd_results.dq_of_sums`` scales it). Each CTA walks work tiles (key tile, head, sample) of a grid the launcher
    sizes by the SM count (``grid``)."""

    dtype: torch.dtype
    head_dim: int
    activation: ActivationName
    q_stages: int = 1
    mask_queries: bool = True
    causal: bool = False
    window: bool = False
    varlen: bool = False
    bias: str = ""
    bias_grad: bool = False
    target: str = "sm_100a"

    def __post_init__(self):
        check_element(self, "the CuTe Blackwell backward")
        if self.head_dim not in SM100_BWD_HEAD_DIMS:
            raise ValueError(f"the CuTe Blackwell backward is built for D = Dv in {SM100_BWD_HEAD_DIMS}; "
                             f"got {self.head_dim}")
        if self.q_stages not in (1, 2):
            raise ValueError(f"Q/dO stages of 1 or 2; got {self.q_stages}")
        if self.bias not in ("", "float32", str(self.dtype).removeprefix("torch.")):
            raise ValueError(f"a bias tensor in the operands' dtype or float32; got {self.bias!r}")
        if self.bias_grad and not self.bias:
            raise ValueError("a bias gradient needs a bias tensor")

    @property
    def head_dim_v(self) -> int:
        return self.head_dim

    def grid(self, tiles: int, num_n: int, sms: int) -> int:
        """CTAs of a launch over ``tiles`` work tiles of ``num_n`` key tiles a head and sample on ``sms`` SMs: one
        an SM (a CTA takes all 512 tensor-memory columns and most of the shared memory), ``persistent_grid``'s
        (coprime with ``num_n`` where tiles differ in work by their key tile position: a band or jagged samples)."""
        return persistent_grid(tiles, sms, num_n, self.causal or self.window or self.varlen)


@functools.lru_cache(maxsize=256)
def plan_bwd_sm100(dtype: torch.dtype, head_dim: int, activation: ActivationName, mask_queries: bool = True,
                   causal: bool = False, window: bool = False, varlen: bool = False, bias: str = "",
                   bias_grad: bool = False) -> Sm100BwdPlan:
    """The Blackwell backward's plan for D = Dv = ``head_dim``: its Q/dO stages from ``sm100_bwd_q_stages``; a window
    takes the causal mask's place; a varlen sample's last query tile is ragged wherever its length falls."""
    return Sm100BwdPlan(dtype, head_dim, activation, q_stages=sm100_bwd_q_stages(head_dim),
                        mask_queries=mask_queries or varlen, causal=causal and not window, window=window,
                        varlen=varlen, bias=bias, bias_grad=bias_grad)
