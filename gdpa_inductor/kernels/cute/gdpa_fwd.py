"""Launcher of the CuTe-DSL Hopper forward: which calls it takes, one compile per (dtype, head dims D and Dv,
activation), and the call itself.

The kernel is compiled once per key against fake tensors (``kernel_args``), every size and stride a runtime
value, so every shape reuses it and the compile checks on CPU build the kernel that runs. The cache is in memory
and on disk (``compile_cache``). cutlass-dsl is imported lazily: the package works without it.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import torch

from ..activations import ACTIVATION_NAMES
from ..common.device import capability_major
from ..common.layout import as_4d, tma_layout
from .compile_cache import cached_compile
from .kernel_args import (
    compile_options,
    dense_modes,
    fake_offset,
    fake_operands,
    fake_rows,
    fake_score_bias,
    fake_stream,
    offset_args,
)

# Head dims of Q/K (D) and of V/O (Dv), in any combination: with 128x128 tiles the forward's two Q stages,
# four K/V stages and O tile take 1024·D + 768·Dv bytes of shared memory (224 KiB at D = Dv = 128), and the
# consumers' O accumulator Dv/2 registers a thread; wgmma's k-blocks need multiples of 16. Past 128 the forward
# takes other tiles (``wide_head_tiles``), and so does the backward (``GdpaBwdWideSm90``).
SUPPORTED_HEAD_DIMS = (64, 96, 128, 256)
# every activation of the table has a CuTe form (activation_math.py, same names)
SUPPORTED_ACTIVATIONS = ACTIVATION_NAMES


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


# Where "auto" takes the wide-head forward: on an H200 (bf16 gelu_tanh, H=4) it ran 1.3-1.9x Triton's forward at
# 1024 and 2048 keys for D/Dv of 256/256 and 256/128 and 1.05-1.2x for 128/256, but at 256 keys 1.06x, 1.34x and
# 0.57x (its O stores from the registers weigh most where the keys are few): Triton below this many keys.
WIDE_HEAD_MIN_KEYS = 1024


def cute_fwd_preferred(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[bool, str]:
    """(ok, reason): whether "auto" should run a supported call on the CuTe forward: everywhere but head dims past
    128 over short key ranges. The causal forward, with its grid coprime with the query tiles
    (``persistent_grid``), measured 1.19-1.32x Triton's on H200 (B·Nq = 590K rows, H=4, D=128, bf16 gelu_tanh,
    256 to 2048 keys)."""
    if max(q.shape[-1], v.shape[-1]) > 128 and k.shape[-2] < WIDE_HEAD_MIN_KEYS:
        return False, f"head dims past 128 take the CuTe forward from {WIDE_HEAD_MIN_KEYS} keys"
    return True, ""


# the causal forward's key tile (and query tile): the one where its mask sits must hold the query tile's diagonal
CAUSAL_TILE = 128


def key_tile(head_dim: int, head_dim_v: int) -> int:
    """Keys per step of the forward for these head dims."""
    return wide_head_tiles(head_dim, head_dim_v).get("tile_n", 128)


@functools.cache
def cute_dsl_available() -> bool:
    """cutlass-dsl, its CUDA bindings and TVM-FFI (the kernels' calling path, ``kernel_args``) import. Cached:
    the dispatch asks on every call, and a module search costs tens of microseconds."""
    return all(importlib.util.find_spec(name) is not None for name in ("cutlass", "cuda", "tvm_ffi"))


def on_sm90(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return capability_major(device.index if device.index is not None else torch.cuda.current_device()) == 9


def _as_4d(q, k, v):
    batch = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
    return tuple(as_4d(t, batch) for t in (q, k, v)), batch


def cute_fwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: str):
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting)."""
    if q.dim() < 3 or k.dim() < 3 or v.dim() < 3:
        return False, "operands need [..., H, N, D]"
    # the machine's answer first: the dispatch asks on every call, and the operands' 4-D views cost 35-60 µs
    ok, reason = machine_support(q.device)
    if not ok:
        return ok, reason
    (q4, k4, v4), batch = _as_4d(q, k, v)
    if bias is not None and bias.numel() != 1:
        scores = (*batch, q.shape[-3], q.shape[-2], k.shape[-2])
        if bias.dim() > len(scores) or any(n not in (1, m) for n, m in zip(bias.shape[::-1], scores[::-1])):
            return False, f"a bias of shape {tuple(bias.shape)} does not broadcast to the scores' {scores}"
    return fwd_supported(q4, k4, v4, _bias_4d(bias, batch, q4.shape[2]), causal, activation)


def machine_support(device: torch.device) -> tuple[bool, str]:
    """(ok, reason): the CuTe stack is installed and the tensors are on an sm_90 GPU."""
    if not cute_dsl_available():
        return False, "nvidia-cutlass-dsl or apache-tvm-ffi is not installed"
    if not on_sm90(device):
        return False, "the CuTe kernel is built for sm_90 (Hopper)"
    return True, ""


def fwd_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: str):
    """(ok, reason) for the CuTe forward on these operands, in the 4-D [Z, H, N, D] layout the op uses."""
    ok, reason = machine_support(q.device)
    if not ok:
        return ok, reason
    ok, reason = score_bias_support(bias, q, k)
    if not ok:
        return ok, reason
    if causal:
        ok, reason = causal_support(q, k, v)
        if not ok:
            return ok, reason
    return operand_support(q, k, v, activation, SUPPORTED_HEAD_DIMS)


def score_bias_support(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> tuple[bool, str]:
    """(ok, reason) for a bias in the CuTe forward ([Z, H, N, D] operands): one element (a constant over the scores,
    such as sigmoid attention's -log n, which each activation form takes into its first product),
    or a tensor over every score's row and column in q's dtype, [Zb, Hb, Nq, Nk] or fewer leading dims, Zb 1 or Z,
    Hb 1 or H, read two neighbouring columns at a time (``score_bias_modes``): its last dim contiguous, Nk and its
    other strides even, 4-byte aligned. A bias of one row for every query (a key-padding bias) comes here as Nq rows
    of stride 0 (``_bias_4d``); one broadcast over the columns (a value per query) is not in it."""
    if bias is None or bias.numel() == 1:
        return True, ""
    z, h, nq = q.shape[:3]
    nk = k.shape[2]
    if bias.dtype != q.dtype:
        return False, f"the CuTe forward reads a bias in the operands' dtype {q.dtype} (got {bias.dtype})"
    if tuple(bias.shape[-2:]) != (nq, nk):
        return False, (f"the CuTe forward takes a bias of one element or one over the scores' rows and columns, its "
                       f"last two dims (Nq, Nk) = ({nq}, {nk}) (got {tuple(bias.shape[-2:])})")
    leading = (1,) * (4 - bias.dim()) + tuple(bias.shape[:-2])
    if bias.dim() > 4 or leading[0] not in (1, z) or leading[1] not in (1, h):
        return False, f"the CuTe forward takes a bias's leading dims [1 or {z}, 1 or {h}] (got {leading})"
    return bias_pairs_support(bias)


def bias_pairs_support(bias: torch.Tensor, kernel: str = "the CuTe forward") -> tuple[bool, str]:
    """(ok, reason) for reading a bias tensor's 16-bit values two neighbouring columns at a time
    (``score_bias_modes``): its last dim contiguous, that dim's size and its other strides even, 4-byte aligned."""
    nk = bias.shape[-1]
    strides = [s for n, s in zip(bias.shape[:-1], bias.stride()[:-1]) if n > 1]
    if bias.stride(-1) != 1 or nk % 2 or any(s % 2 for s in strides) or bias.data_ptr() % 4:
        return False, (f"{kernel} reads a bias's values in pairs: its last dim contiguous, Nk and its other "
                       f"strides even, 4-byte aligned (got Nk={nk}, strides {bias.stride()})")
    return True, ""


def score_bias_modes(bias: torch.Tensor) -> torch.Tensor:
    """A bias ``score_bias_support`` takes -> its values' pairs as int32 in the forward's (Nq, Nk / 2, Hb, Zb) mode
    order (a view)."""
    b = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    # torch's dtype view wants every stride even, size-1 dims' too (never stepped along: any even one does)
    b = torch.as_strided(b, b.shape, [s if n > 1 else 2 for n, s in zip(b.shape[:-1], b.stride()[:-1])] + [1])
    return dense_modes(b.view(torch.int32))


def causal_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[bool, str]:
    """(ok, reason) for the CuTe kernels' causal mask: the forward masks one key tile per query tile, which must
    hold the whole query tile's diagonal (128-key tiles, so D and Dv at most 128, and Nk - Nq a whole number of
    them), and the backward masks the two 64-row query tiles across each key tile's diagonal; Nq > Nk (query rows
    without keys) is left to Triton."""
    nq, nk = q.shape[-2], k.shape[-2]
    if max(q.shape[-1], v.shape[-1]) > 128:
        return False, "causal masking in the CuTe kernels needs D and Dv of at most 128"
    if nk < nq or (nk - nq) % CAUSAL_TILE:
        return False, (f"causal masking in the CuTe kernels needs Nk - Nq to be a non-negative multiple of "
                       f"{CAUSAL_TILE}; got Nq={nq}, Nk={nk}")
    return True, ""


def operand_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: str, head_dims: tuple,
                    kernel: str = "the CuTe forward") -> tuple[bool, str]:
    """(ok, reason) for what every CuTe forward needs of its operands: an activation with a CuTe form, fp16/bf16
    of one dtype, D and Dv each in ``head_dims``, and layouts TMA can read."""
    if activation not in SUPPORTED_ACTIVATIONS:
        return False, f"activation {activation!r} has no CuTe form"
    if q.dtype not in (torch.float16, torch.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        return False, f"{kernel} takes fp16/bf16 operands of one dtype"
    d, dv = q.shape[-1], v.shape[-1]
    if d not in head_dims or dv not in head_dims:
        return False, f"head dims (D={d}, Dv={dv}) must each be one of {head_dims} for {kernel}"
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.stride(-1) != 1:
            return False, f"{name} must have a contiguous last dim"
        if not tma_layout(t):
            return False, f"{name} strides must be positive multiples of 16 bytes from a 16-byte-aligned address (TMA)"
    return True, ""


def compile_fwd(
    dtype: torch.dtype, head_dim: int, activation: str, keep_ptx: bool = False,
    pingpong: bool | None = None, split_store: bool | None = None, mask_keys: bool = True,
    head_dim_v: int | None = None, varlen: bool = False, causal: bool = False, band: bool = False,
    score_offset: bool = False, score_bias: bool = False,
):
    """The compiled forward for (dtype, head dims, activation, schedule, masking), compiled once and cached in
    memory and on disk (``compile_cache``): its sizes and strides are runtime values, so every shape reuses it.
    Compiled against fake tensors (``kernel_args``), which needs no GPU (target sm_90a); called with the four
    tensors in the kernel's mode order (``kernel_args.dense_modes``). ``keep_ptx`` keeps the PTX in
    ``.artifacts`` (compile tests). ``pingpong``/``split_store``: None takes ``fwd_schedule``.
    ``mask_keys``: Nk is not a multiple of the key tile (the last key tile's padded columns give P = 0).
    ``head_dim_v``: V's and O's head dim (None: ``head_dim``). ``varlen``: per-sample rows (the call then ends
    with the (5, B) rows tensor and the longest sample's query tiles, see ``GdpaFwdSm90.__call__``; its keys
    always masked). ``causal``: the bottom-right aligned causal mask (``causal_support``'s cases; it also masks
    the keys past Nk, so ``mask_keys`` is dropped). ``band`` (varlen): the mask of a band around each sample's
    diagonal, its bounds the call's arguments after the rows. ``score_offset``: a one-element bias, the call's
    last argument (after Nones for the varlen and band arguments it lacks; ``GdpaFwdSm90``). ``score_bias``: a
    bias tensor (``score_bias_support``; varlen: ``varlen_bias_support``), the call's argument after the one
    element's."""
    if band and not varlen:
        raise ValueError("band=True needs varlen=True (the band mask is in the varlen kernels)")
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    plain = not (varlen or causal or band or score_offset or score_bias)
    schedule = fwd_schedule(head_dim, head_dim_v, plain)
    pingpong = schedule[0] if pingpong is None else pingpong
    split_store = schedule[1] if split_store is None else split_store
    mask_keys = (mask_keys or varlen) and not causal
    key = ("fwd", str(dtype), head_dim, head_dim_v, activation, keep_ptx, pingpong, split_store, mask_keys, varlen)
    if causal:
        key = (*key, "causal")
    if band:
        key = (*key, "band")
    if score_offset:
        key = (*key, "offset")
    if score_bias:
        key = (*key, "bias")

    def build():
        import cutlass
        import cutlass.cute as cute

        from . import activation_math
        from .gdpa_fwd_sm90 import GdpaFwdSm90

        element = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}[dtype]
        # varlen: the rows tensor and the longest sample's query tiles follow the stream; a band, its bounds
        extra = [fake_rows(), cutlass.Int32(1)] if varlen else []
        extra += [cutlass.Int32(1), cutlass.Int32(1)] if band else []
        if score_offset:
            extra += [None] * (4 - len(extra)) + [fake_offset()]
        if score_bias:
            extra += [None] * (5 - len(extra)) + [fake_score_bias()]
        one = cutlass.Float32(1.0)
        # with a bias, the fp32 forms: the packed ones round x = S + bias / scale to bf16 and compute 1 + tanh(u) in
        # bf16, which cancels where a negative bias moves the scores (gelu_tanh at bias -1.5: 2.2x eager's error)
        form = activation_math.forward_form(
            activation, element is cutlass.BFloat16 and not (score_offset or score_bias))
        kernel = GdpaFwdSm90(
            element, head_dim, head_dim_v, form, pingpong=pingpong, split_store=split_store, mask_keys=mask_keys,
            varlen=varlen, causal=causal, band=band, score_offset=score_offset, score_bias=score_bias,
            kv_stages=fwd_kv_stages(head_dim, head_dim_v, plain), **wide_head_tiles(head_dim, head_dim_v),
        )
        return cute.compile(
            kernel, *fake_operands(element, 4), one, one, one, cutlass.Int32(1), fake_stream(), *extra,
            options=compile_options(keep_ptx),
        )

    # builds with the PTX kept (compile checks) stay in memory
    return cached_compile(key, build, persist=not keep_ptx)


def persistent_grid(tiles: int, sms: int, num_m: int, uneven: bool) -> int:
    """CTAs of the persistent forward: one per SM (its shared memory and registers admit one), never more than
    the ``tiles``. CTA c runs tiles c, c + P, c + 2P, ... of the order query tiles fastest (``num_m`` a head or
    sample). Where tiles differ in work by their query tile position (``uneven``: under the causal mask query tile
    m computes m + 1 key tiles; in a varlen batch the later positions exist only in the longer samples), a grid P
    that shares a factor with ``num_m`` pins each CTA to a few positions: P = 132 and 16 query tiles give a causal
    CTA 28 or 40 key tiles per four query tiles, and the CTAs given the light ones idle at the end. Such grids take
    the largest P coprime with ``num_m``: every CTA then runs each position once in any ``num_m`` of its tiles
    (H200: causal 1.13-1.58x, varlen with lengths uniform in [1, N] 1.12-1.20x, full varlen samples 0.98x)."""
    grid = min(tiles, sms)
    if uneven and tiles > grid:
        while math.gcd(grid, num_m) != 1:
            grid -= 1
    return grid


def gdpa_fwd_cute(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: str, scale: float, post_scale: float,
    negative_slope: float, pingpong: bool | None = None, split_store: bool | None = None,
    out: torch.Tensor | None = None, causal: bool = False, bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [Z, H, Nq, D], k [Z, Hkv, Nk, D], v [Z, Hkv, Nk, Dv] (checked by ``fwd_supported``) -> out
    [Z, H, Nq, Dv]. ``pingpong`` and ``split_store`` override ``fwd_schedule`` (benchmarks, tests). ``out``: a
    tensor of that shape and q's dtype to write (TMA's layout rules, as for q), else a new one. ``causal``: the
    bottom-right aligned causal mask. ``bias``: one element (any float dtype), added to every score, or a tensor
    ``score_bias_support`` takes (in its 4-D form: leading dims of 1 or Z and of 1 or H), added to each."""
    if out is None:
        out = torch.empty((*q.shape[:3], v.shape[-1]), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if k.shape[2] == 0:
        return out.zero_()
    tensor_bias = bias if bias is not None and bias.numel() != 1 else None
    offset = bias if tensor_bias is None else None
    fn = compile_fwd(q.dtype, q.shape[-1], activation, pingpong=pingpong, split_store=split_store,
                     mask_keys=k.shape[2] % key_tile(q.shape[-1], v.shape[-1]) != 0, head_dim_v=v.shape[-1],
                     causal=causal, score_offset=offset is not None, score_bias=tensor_bias is not None)
    num_m = -(-q.shape[2] // 128)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    num_ctas = persistent_grid(num_m * q.shape[1] * q.shape[0], sms, num_m, causal)
    # no rows, no query-tile count, no band: a dense batch; then the one-element bias or the bias tensor, or None
    # (a function loaded from the disk cache fills in no defaults)
    fn(*(dense_modes(t) for t in (q, k, v, out)), scale, post_scale, negative_slope, num_ctas, None, None, None,
       None, *offset_args(offset), None if tensor_bias is None else score_bias_modes(tensor_bias))
    return out



def _bias_4d(bias: torch.Tensor | None, batch: tuple, num_queries: int) -> torch.Tensor | None:
    """The op's bias ([..., Hb, Nq or 1, Nk] broadcasting to [*batch, H, Nq, Nk]) with its batch dims flattened as
    the operands' (``as_4d``): Zb is 1 where it broadcasts over the whole batch; one element stays as it is. A bias
    of one row for every query (a key-padding bias) is seen as ``num_queries`` rows of stride 0: the kernels read
    it as any other (the backward's TMA takes the zero stride), and its gradient sums over them (``gdpa_bwd_cute``'s
    ``one_row_bias``)."""
    if bias is None or bias.numel() == 1:
        return bias
    b = bias.reshape((1,) * (len(batch) + 3 - bias.dim()) + tuple(bias.shape))
    b = b.reshape(1, *b.shape[-3:]) if all(n == 1 for n in b.shape[:-3]) else as_4d(b, batch)
    if b.shape[-2] == 1 and num_queries > 1:
        b = b.expand(*b.shape[:-2], num_queries, b.shape[-1])
    return b


def gdpa_fwd_cute_batched(q, k, v, activation: str, scale: float, post_scale: float, negative_slope: float,
                          causal: bool = False, bias: torch.Tensor | None = None):
    """The op's forward on the CuTe kernel: [..., H, N, D] operands (``cute_fwd_support`` checked) ->
    [*batch, H, Nq, Dv]."""
    (q4, k4, v4), batch = _as_4d(q, k, v)
    out = gdpa_fwd_cute(q4, k4, v4, activation, scale, post_scale, negative_slope, causal=causal,
                        bias=_bias_4d(bias, batch, q4.shape[2]))
    return out.view(*batch, *out.shape[1:])
