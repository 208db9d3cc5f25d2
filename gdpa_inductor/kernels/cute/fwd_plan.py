"""How the CuTe-DSL Hopper forward runs a call: its tiles, stages and schedule (each decision with the measurement
behind it), frozen in a ``FwdPlan`` that is also the compile key, and the persistent grid of a launch."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ..activations import ACTIVATION_NAMES, PACKED_BF16_FORWARD, ActivationName


def fwd_schedule(head_dim: int, head_dim_v: int | None = None, plain: bool = False) -> tuple[bool, bool]:
    """(ping-pong, split O store) for head dims D and Dv (None: Dv = D), by the matmul work per score, D + Dv.
    Measured on an H200 (bf16 gelu_tanh, 256 to 2048 keys, every provider run untimed for 300 ms before its
    timing): at D = Dv = 128 the warpgroups taking turns on the tensor cores, each storing its own rows of O, is
    fastest or tied at every shape (+7% at 256 keys); at D + Dv of 192-224 (96/96, 64/128, 128/64, 96/128) the
    two schedules are within 3% of each other at all but one shape: turns ahead at 256 keys for 64/128, 128/64
    and 96/128 (+2-3%), behind at 96/96 (-1% at 256 keys, -4% at 2048); at 64/96 one shared store is ahead by
    up to 3%. Without the untimed runs: at D = Dv = 64 turns lose 0.5-4%, at
    96/64 they tie at 1024-2048 keys and gain 6% at 256. ``plain``: a dense batch without the causal mask or a
    bias; at D = Dv = 64 it takes turns too, which with three K/V stages measured faster (``fwd_kv_stages``)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    return (True, True) if head_dim + head_dim_v >= 192 or _plain_d64(head_dim, head_dim_v, plain) else (False, False)


def fwd_kv_stages(head_dim: int, head_dim_v: int | None = None, plain: bool = False) -> int:
    """K/V stages of the forward: three for a plain batch (``fwd_schedule``) at D = Dv = 64, two elsewhere (at D = Dv
    = 128 two fill shared memory). With ping-pong and split O stores, the dense D = 64 forward measured on an H100
    (bf16 gelu_tanh, five settled rotated rounds, against one shared store and two stages): +3.8% at 2048²,
    +3.0% at 1024², +2.8% at 512², +8.8% at 256², +1.3 / +0.7 / -0.8% at 512 / 1024 / 2048 x 256; causal it lost
    3.5% at 2048² (+3.4% at 512²), so the causal mask keeps the other schedule, as do the varlen batches and the
    biases (not measured)."""
    return 3 if _plain_d64(head_dim, head_dim if head_dim_v is None else head_dim_v, plain) else 2


def _plain_d64(head_dim: int, head_dim_v: int, plain: bool) -> bool:
    return plain and head_dim == head_dim_v == 64


def wide_head_tiles(head_dim: int, head_dim_v: int) -> dict:
    """GdpaFwdSm90's tiling where a head dim is above 128: 64-key tiles, one Q stage and O stored from the
    registers, so Q (64 KB at D = 256) and two stages of K and V fit in shared memory (192 KB at D = Dv = 256)
    and the O accumulator (128 registers a thread at Dv = 256) leaves room for the scores."""
    if max(head_dim, head_dim_v) <= 128:
        return {}
    return dict(tile_n=64, q_stages=1, o_from_registers=True)


def key_tile(head_dim: int, head_dim_v: int) -> int:
    """Keys per step of the forward for these head dims."""
    return wide_head_tiles(head_dim, head_dim_v).get("tile_n", 128)


def persistent_grid(tiles: int, sms: int, num_m: int, uneven: bool) -> int:
    """CTAs of a persistent Blackwell kernel: one per SM (its shared memory and registers admit one), never more than
    the ``tiles``. CTA c runs tiles c, c + P, c + 2P, ... of the order query tiles (the backward's key tiles)
    fastest (``num_m`` a head or sample). Where tiles differ in work by their query tile position (``uneven``: under
    the causal mask query tile m computes m + 1 key tiles; in a varlen batch the later positions exist only in the
    longer samples), a grid P that shares a factor with ``num_m`` pins each CTA to a few positions: P = 132 and 16
    query tiles give a causal CTA 28 or 40 key tiles per four query tiles, and the CTAs given the light ones idle at
    the end. Such grids take the largest P coprime with ``num_m``: every CTA then runs each position once in any
    ``num_m`` of its tiles (H200: causal 1.13-1.58x, varlen with lengths uniform in [1, N] 1.12-1.20x, full varlen
    samples 0.98x)."""
    grid = min(tiles, sms)
    if uneven and tiles > grid:
        while math.gcd(grid, num_m) != 1:
            grid -= 1
    return grid


def check_element(plan, kernel: str) -> None:
    """A plan's dtype and activation are ones the CuTe kernels are built for (ValueError naming them otherwise)."""
    if plan.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{kernel} is built for fp16 or bf16, got {plan.dtype}")
    if plan.activation not in ACTIVATION_NAMES:
        raise ValueError(f"activation: expected one of {ACTIVATION_NAMES}; got {plan.activation!r}")


@dataclasses.dataclass(frozen=True)
class FwdPlan:
    """One build of the forward (``GdpaFwdSm90``) and why it is shaped so: the plan is the compile key (every
    field but ``reason``). ``mask_keys``: the last key tile's columns past Nk give P = 0 (always in a varlen
    batch; under ``causal`` the diagonal's mask covers them). ``band`` (varlen): the band around each sample's
    diagonal, its bounds run-time arguments. ``score_offset``: a one-element bias; ``score_bias``: a bias tensor.
    ``pingpong``, ``split_store``, ``kv_stages``: the schedule (``fwd_schedule``, ``fwd_kv_stages``); ``tile_n``,
    ``q_stages``, ``o_from_registers``: the tiles (``wide_head_tiles``); ``packed``: the activation's packed
    bf16x2 form, where its row has one (bf16 without a bias: with one the fp32 forms, since the packed ones round
    x = S + bias / scale to bf16 and compute 1 + tanh(u) in bf16, which cancels where a negative bias moves the
    scores: gelu_tanh at bias -1.5 gave 2.2x eager's error)."""

    dtype: torch.dtype
    head_dim: int
    head_dim_v: int
    activation: ActivationName
    varlen: bool = False
    causal: bool = False
    band: bool = False
    score_offset: bool = False
    score_bias: bool = False
    mask_keys: bool = True
    pingpong: bool = False
    split_store: bool = False
    kv_stages: int = 2
    tile_n: int = 128
    q_stages: int = 2
    o_from_registers: bool = False
    packed: bool = False
    reason: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self):
        check_element(self, "the CuTe forward")
        if self.band and not self.varlen:
            raise ValueError("band=True needs varlen=True (the band mask is in the varlen kernels)")




# plans are pure functions of their arguments, asked for at every launch
@functools.lru_cache(maxsize=4096)
def plan_fwd(dtype: torch.dtype, head_dim: int, activation: ActivationName, head_dim_v: int | None = None, *,
             mask_keys: bool = True, varlen: bool = False, causal: bool = False, band: bool = False,
             score_offset: bool = False, score_bias: bool = False) -> FwdPlan:
    """The forward's plan for a call of these head dims (None: Dv = D), masks and bias: the schedule of
    ``fwd_schedule`` and ``fwd_kv_stages``, the tiles of ``wide_head_tiles``. ``mask_keys``: Nk is not a multiple
    of the key tile (``key_tile``)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    plain = not (varlen or causal or band or score_offset or score_bias)
    pingpong, split_store = fwd_schedule(head_dim, head_dim_v, plain)
    kv_stages = fwd_kv_stages(head_dim, head_dim_v, plain)
    tiles = wide_head_tiles(head_dim, head_dim_v)
    packed = dtype == torch.bfloat16 and not (score_offset or score_bias) and activation in PACKED_BF16_FORWARD
    if tiles:
        reason = "64-key tiles, one Q stage, O stored from the registers: a head dim past 128"
    elif _plain_d64(head_dim, head_dim_v, plain):
        reason = "warpgroups taking turns, each storing its rows of O, three K/V stages: a plain batch at D = Dv = 64"
    elif pingpong:
        reason = "warpgroups taking turns, each storing its rows of O: D + Dv of 192 or more"
    else:
        reason = "one shared O store, no turns: D + Dv below 192"
    return FwdPlan(dtype, head_dim, head_dim_v, activation, varlen=varlen, causal=causal, band=band,
                   score_offset=score_offset, score_bias=score_bias, mask_keys=(mask_keys or varlen) and not causal,
                   pingpong=pingpong, split_store=split_store, kv_stages=kv_stages, packed=packed,
                   reason=reason, **tiles)



# --- the Blackwell forward (GdpaFwdSm100): D = Dv of 64 or 128; causal mask, windows, a bias tensor, varlen ---

# shared memory the forward's Q tile and K/V stages may take: below sm_100's 227 KB a block, leaving room for the
# barriers and the allocator's reserve
SM100_SMEM_BUDGET = 200 * 1024
# shared memory of one sm_100 SM; each CTA also takes 1 KB of it
SM100_SMEM_PER_SM = 228 * 1024
SM100_HEAD_DIMS = (64, 128)
# keys per step of the Blackwell forward by default (``plan_fwd_sm100``): 64 also builds
SM100_KEY_TILE = 128


def sm100_kv_stages(head_dim: int, tile_n: int = SM100_KEY_TILE, element_bytes: int = 2) -> int:
    """K/V stages of the Blackwell forward: as many (K, V) tile pairs as fit beside two Q tiles (the persistent
    schedule's Q stages), at most three (two at D = 128: 64 KB of Q and 64 KB a pair; three at D = 64)."""
    q_bytes = 2 * 128 * head_dim * element_bytes
    pair_bytes = 2 * tile_n * head_dim * element_bytes
    return max(1, min(3, (SM100_SMEM_BUDGET - q_bytes) // pair_bytes))


# the element types a Blackwell forward's bias tensor may have (``Sm100FwdPlan.bias``), by torch's names
SM100_BIAS_DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class Sm100FwdPlan:
    """One build of the Blackwell forward (``GdpaFwdSm100``), compiled for ``target``: the plan is the compile key
    (every field). ``mask_keys``: keys past Nk give P = 0 (Nk not a multiple of ``tile_n``; always in a varlen
    batch); ``kv_stages``: ``sm100_kv_stages``; ``causal``: the bottom-right aligned causal mask; ``window``: a band
    around the diagonal, its bounds run-time arguments (with ``causal`` the launcher folds the causal bound into
    them); ``bias``: the bias tensor's element type by torch's name ("" for none; a 16-bit one is the operands');
    ``varlen``: jagged samples (``cu_seqlens``). Each CTA walks work tiles of a grid the launcher sizes by the SM
    count (``grid``), with two Q stages so that the next tile's Q loads under this one's matmuls."""

    dtype: torch.dtype
    head_dim: int
    activation: ActivationName
    tile_n: int = SM100_KEY_TILE
    kv_stages: int = 2
    mask_keys: bool = True
    causal: bool = False
    window: bool = False
    bias: str = ""
    varlen: bool = False
    target: str = "sm_100a"

    def __post_init__(self):
        check_element(self, "the CuTe Blackwell forward")
        if self.head_dim not in SM100_HEAD_DIMS:
            raise ValueError(f"the CuTe Blackwell forward is built for D = Dv in {SM100_HEAD_DIMS}; "
                             f"got {self.head_dim}")
        if self.tile_n not in (64, 128):
            raise ValueError(f"key tiles of 64 or 128; got {self.tile_n}")
        if self.bias not in ("", "float32", str(self.dtype).removeprefix("torch.")):
            raise ValueError(f"a bias tensor in the operands' dtype or float32; got {self.bias!r}")

    @property
    def head_dim_v(self) -> int:
        return self.head_dim

    @property
    def q_stages(self) -> int:
        return 2

    @property
    def ctas_per_sm(self) -> int:
        """CTAs of this build one SM holds at once: by tensor memory (512 columns; each CTA's two S buffers and O
        rounded up to a power of two, ``gdpa_fwd_sm100.tmem_columns``) and by shared memory (Q and K/V stages,
        barriers and the 1 KB reserve). Two for 64-key tiles at D = 64, else one."""
        columns = 1 << (2 * self.tile_n + self.head_dim - 1).bit_length()
        smem = 2 * self.head_dim * (128 * self.q_stages + 2 * self.tile_n * self.kv_stages) + 2048
        return max(1, min(512 // columns, SM100_SMEM_PER_SM // smem))

    def grid(self, tiles: int, num_m: int, sms: int) -> int:
        """CTAs of a launch over ``tiles`` work tiles of ``num_m`` query tiles a head and sample on ``sms`` SMs:
        ``persistent_grid``'s over the CTAs the SMs hold at once (``ctas_per_sm``; coprime with ``num_m`` where
        tiles differ in work: a band or jagged samples)."""
        return persistent_grid(tiles, sms * self.ctas_per_sm, num_m, self.causal or self.window or self.varlen)


@functools.lru_cache(maxsize=256)
def plan_fwd_sm100(dtype: torch.dtype, head_dim: int, activation: ActivationName, tile_n: int = SM100_KEY_TILE,
                   mask_keys: bool = True, causal: bool = False, window: bool = False, bias: str = "",
                   varlen: bool = False) -> Sm100FwdPlan:
    """The Blackwell forward's plan for D = Dv = ``head_dim``: its K/V stages from ``sm100_kv_stages``; a window
    (``window``) takes the causal bound into its run-time bounds, so one build serves both."""
    return Sm100FwdPlan(dtype, head_dim, activation, tile_n=tile_n, kv_stages=sm100_kv_stages(head_dim, tile_n),
                        mask_keys=mask_keys or varlen, causal=causal and not window, window=window, bias=bias,
                        varlen=varlen)
