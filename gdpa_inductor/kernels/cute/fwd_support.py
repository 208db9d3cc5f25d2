"""Which calls the CuTe-DSL Hopper forward takes: the machine, the operands, the causal mask and the bias, each
an (ok, reason) check; and where "auto" prefers it to Triton."""

from __future__ import annotations

import functools
import importlib.util

import torch

from ..activations import ACTIVATION_NAMES, ActivationName
from ..common.device import capability_major
from ..common.layout import tma_layout
from .operand_views import bias_4d, flatten_batch

# Head dims of Q/K (D) and of V/O (Dv), in any combination: with 128x128 tiles the forward's two Q stages,
# four K/V stages and O tile take 1024·D + 768·Dv bytes of shared memory (224 KiB at D = Dv = 128), and the
# consumers' O accumulator Dv/2 registers a thread; wgmma's k-blocks need multiples of 16. Past 128 the forward
# takes other tiles (``wide_head_tiles``), and so does the backward (``GdpaBwdWideSm90``).
SUPPORTED_HEAD_DIMS = (64, 96, 128, 256)
# every activation of the table has CuTe forms (its row names them; activation_math.py checks them when imported)
SUPPORTED_ACTIVATIONS = ACTIVATION_NAMES


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


@functools.cache
def cute_dsl_available() -> bool:
    """cutlass-dsl, its CUDA bindings and TVM-FFI (the kernels' calling path, ``kernel_args``) import. Cached:
    the dispatch asks on every call, and a module search costs tens of microseconds."""
    return all(importlib.util.find_spec(name) is not None for name in ("cutlass", "cuda", "tvm_ffi"))


def on_sm90(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return capability_major(device.index if device.index is not None else torch.cuda.current_device()) == 9


def cute_fwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName):
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting)."""
    if q.dim() < 3 or k.dim() < 3 or v.dim() < 3:
        return False, "operands need [..., H, N, D]"
    # the machine's answer first: the dispatch asks on every call, and the operands' 4-D views cost 35-60 µs
    ok, reason = machine_support(q.device)
    if not ok:
        return ok, reason
    (q4, k4, v4), batch = flatten_batch(q, k, v)
    if bias is not None and bias.numel() != 1:
        scores = (*batch, q.shape[-3], q.shape[-2], k.shape[-2])
        if bias.dim() > len(scores) or any(n not in (1, m) for n, m in zip(bias.shape[::-1], scores[::-1])):
            return False, f"a bias of shape {tuple(bias.shape)} does not broadcast to the scores' {scores}"
    return fwd_supported(q4, k4, v4, bias_4d(bias, batch, q4.shape[2]), causal, activation)


def machine_support(device: torch.device) -> tuple[bool, str]:
    """(ok, reason): the CuTe stack is installed and the tensors are on an sm_90 GPU."""
    if not cute_dsl_available():
        return False, "nvidia-cutlass-dsl or apache-tvm-ffi is not installed"
    if not on_sm90(device):
        return False, "the CuTe kernel is built for sm_90 (Hopper)"
    return True, ""


def fwd_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName):
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
    of stride 0 (``bias_4d``); one broadcast over the columns (a value per query) is not in it."""
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


def operand_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: ActivationName, head_dims: tuple,
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


def on_sm100(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return capability_major(device.index if device.index is not None else torch.cuda.current_device()) == 10


def sm100_fwd_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                        activation: ActivationName, window: tuple[int, int] = (-1, -1)) -> tuple[bool, str]:
    """(ok, reason) for the Blackwell forward (``GdpaFwdSm100``, built by ``kernel_build.compile_fwd_sm100``) on
    [Z, H, N, D] operands: an sm_100 GPU, D = Dv in ``SM100_HEAD_DIMS``, at least one key (the kernel has no path for
    an empty key range), a bias ``sm100_bias_support`` takes, a ``window`` of bounds >= -1, and ``operand_support``'s
    dtypes and TMA layouts. The causal mask and windows take any Nq and Nk (rows without keys give O = 0). The
    dispatch asks it on sm_100 for dense calls, the causal mask and a bias included (``lowering/sm100_forward.py``),
    then the self-check of the call's build: no Blackwell GPU in this project's tests has run the kernel."""
    from .fwd_plan import SM100_HEAD_DIMS

    if not cute_dsl_available():
        return False, "nvidia-cutlass-dsl or apache-tvm-ffi is not installed"
    if not on_sm100(q.device):
        return False, "the CuTe Blackwell forward is built for sm_100"
    ok, reason = sm100_bias_support(bias, q, k)
    if not ok:
        return ok, reason
    if len(window) != 2 or min(window) < -1:
        return False, f"the CuTe Blackwell forward takes a window of two bounds, each -1 (none) or >= 0 (got {window})"
    if q.shape[-1] != v.shape[-1]:
        return False, f"the CuTe Blackwell forward needs D = Dv (got D={q.shape[-1]}, Dv={v.shape[-1]})"
    if k.shape[-2] == 0:
        return False, "the CuTe Blackwell forward needs at least one key"
    if k.shape[:-1] != v.shape[:-1] or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
        return False, (f"the CuTe Blackwell forward needs k and v of one shape but the last dim, q's batch, and q's "
                       f"heads a multiple of k's (got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    return operand_support(q, k, v, activation, SM100_HEAD_DIMS, kernel="the CuTe Blackwell forward")


def sm100_bias_support(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> tuple[bool, str]:
    """(ok, reason) for a bias in the Blackwell forward ([Z, H, N, D] operands): one element (any float dtype, read
    as an fp32 row), or a tensor [Zb, Hb, Nq, Nk] (or fewer leading dims; Zb 1 or Z, Hb 1 or H, dims of one
    broadcast, a query dim of stride 0 too) in q's dtype, read as ``score_bias_support`` reads it (pairs of
    neighbouring columns), or in fp32 with its last dim contiguous and 4-byte aligned."""
    if bias is None or bias.numel() == 1 or bias.dtype != torch.float32:
        ok, reason = score_bias_support(bias, q, k)
        return ok, reason.replace("the CuTe forward", "the CuTe Blackwell forward")
    z, h, nq = q.shape[:3]
    nk = k.shape[2]
    leading = (1,) * (4 - bias.dim()) + tuple(bias.shape[:-2])
    if tuple(bias.shape[-2:]) != (nq, nk) or bias.dim() > 4 or leading[0] not in (1, z) or leading[1] not in (1, h):
        return False, (f"the CuTe Blackwell forward takes a bias [1 or {z}, 1 or {h}, {nq}, {nk}] (got "
                       f"{tuple(bias.shape)})")
    if bias.stride(-1) != 1 or bias.data_ptr() % 4:
        return False, (f"the CuTe Blackwell forward reads an fp32 bias with its last dim contiguous, 4-byte aligned "
                       f"(got strides {bias.stride()})")
    return True, ""
