"""Launcher of the CuTe-DSL Hopper forward over varlen batches (``GdpaFwdSm90`` with ``varlen``): which calls
it takes, and the call on the rows the varlen schedule gives (``kernels/triton/varlen_schedule.py``: each
sample's first row and length on both sides, samples longest first).

Each side is a jagged ``[total, H, D]`` tensor or a dense ``[B or 1, N, H, D]`` one (padded batches pass their
valid lengths); the kernel reads each sample's rows through TMA descriptors bounded at the sample's end, so a
sample never reads or writes another's rows, and its persistent CTAs skip the query tiles past each sample's
length. One compile per (dtype, head dims, activation, mask, kind of bias), shared with nothing else: the keys are
always masked (under ``causal`` by the diagonal's mask, as in the dense kernel). The mask is none, the causal mask where
every sample's diagonal is known to align with the tiles (``varlen_causal_support``), or else a band around each
sample's diagonal (``varlen_band``: the causal mask at any Nk - Nq, sliding windows, HSTU's ``max_attn_len``) whose
bounds the kernels take at run time.
"""

from __future__ import annotations

import torch

from ..activations import ActivationName
from ..common.varlen_rows import VarlenSide
from ..common.window_bounds import band_limits
from .gdpa_fwd import (
    CAUSAL_TILE,
    bias_pairs_support,
    compile_fwd,
    cute_dsl_available,
    on_sm90,
    operand_support,
    persistent_grid,
    score_bias_modes,
)
from .kernel_args import offset_args, row_modes

# the dense forward's head dims: past 128 its wide-head tiles (64 keys, O stored from the registers, the rows past
# each sample's end predicated off)
VARLEN_HEAD_DIMS = (64, 96, 128, 256)
_TILE_M = 128


def cute_varlen_fwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                            window: tuple[int, int], activation: ActivationName, rows: tuple,
                            kernel: str = "the CuTe varlen forward",
                            head_dims: tuple = VARLEN_HEAD_DIMS) -> tuple[bool, str]:
    """(ok, reason) for the CuTe varlen forward on the varlen op's operands (``[total, H, D]`` or
    ``[B, N, H, D]`` each) and ``rows``, their (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k); ``kernel``
    names it in the reasons and ``head_dims`` are D's and Dv's (the backward takes the same calls at its own head
    dims)."""
    if not cute_dsl_available():
        return False, "nvidia-cutlass-dsl or apache-tvm-ffi is not installed"
    if not on_sm90(q.device):
        return False, "the CuTe kernel is built for sm_90 (Hopper)"
    ok, reason = varlen_bias_support(bias, q, k, kernel)
    if not ok:
        return ok, reason
    if (causal or tuple(window) != (-1, -1)) and max(q.shape[-1], v.shape[-1]) > CAUSAL_TILE:
        return False, f"causal masking and windows in {kernel} need D and Dv of at most {CAUSAL_TILE}"
    return operand_support(q, k, v, activation, head_dims, kernel)


def varlen_bias_support(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
                        kernel: str = "the CuTe varlen forward") -> tuple[bool, str]:
    """(ok, reason) for a bias in the CuTe varlen kernels: one element, or a tensor ``gdpa_varlen`` took (in q's
    dtype, broadcasting to [B, H, max_seqlen_q, max_seqlen_k]) that holds a value for every position of a sample,
    read at the sample's index and the positions within it: its last two dims not broadcast (more than one along a
    jagged side, a dense side's N), its values readable in pairs (``bias_pairs_support``)."""
    if bias is None or bias.numel() == 1:
        return True, ""
    if bias.dtype != q.dtype:
        return False, f"{kernel} reads a bias in the operands' dtype {q.dtype} (got {bias.dtype})"
    if bias.dim() < 2:
        return False, f"{kernel} takes a bias over the scores' rows and columns (got shape {tuple(bias.shape)})"
    for what, n, side in (("query", bias.shape[-2], q), ("key", bias.shape[-1], k)):
        per_sample = side.shape[1] if side.dim() == 4 else None
        if n == 1 and per_sample != 1:
            return False, (f"{kernel} takes a bias with a value for every {what} position of a sample (got shape "
                           f"{tuple(bias.shape)}, broadcast over them)")
    return bias_pairs_support(bias, kernel)


def varlen_band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: tuple[int, int],
                rows: tuple) -> tuple[int, int] | None:
    """The (left, right) bounds of the band mask the CuTe varlen kernels run for a supported call (key j kept for
    query i of a sample iff ``-left <= j - i - (nk - nq) <= right``, ``band_limits``' values), or None where they
    run the plain kernels or the aligned causal ones (``varlen_causal_support``), which mask fewer tiles."""
    if tuple(window) == (-1, -1) and (not causal or varlen_causal_support(q, k, v, rows)[0]):
        return None
    return band_limits(causal, window)


def varlen_causal_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: tuple,
                          kernel: str = "the CuTe varlen forward") -> tuple[bool, str]:
    """(ok, reason) for the causal mask in the CuTe varlen kernels: the dense kernels' rule (``causal_support``)
    in every sample, Nk - Nq a non-negative multiple of 128. Without reading the offsets on the host (a device
    sync per call) that is known only where it holds by construction: both sides' rows from one ``cu_seqlens``
    tensor (self-attention over jagged sequences, HSTU's case) or one ``seqused`` tensor (Nk = Nq per sample), or
    full dense sides whose lengths differ by such a multiple. Equal offsets in two tensors take Triton's kernel."""
    cu_q, cu_k, used_q, used_k = rows
    if max(q.shape[-1], v.shape[-1]) > CAUSAL_TILE:
        return False, f"causal masking in {kernel} needs D and Dv of at most {CAUSAL_TILE}"
    if cu_q is not None or cu_k is not None:
        if cu_q is not cu_k:
            return False, (f"causal masking in {kernel} needs queries and keys to take their rows from one "
                           "cu_seqlens tensor (per-sample lengths are not read on the host)")
        return True, ""
    if used_q is not None or used_k is not None:
        if used_q is not used_k:
            return False, (f"causal masking in {kernel} needs queries and keys to take their valid lengths from "
                           "one seqused tensor (per-sample lengths are not read on the host)")
        return True, ""
    nq, nk = q.shape[1], k.shape[1]
    if nk < nq or (nk - nq) % CAUSAL_TILE:
        return False, (f"causal masking in {kernel} needs Nk - Nq to be a non-negative multiple of {CAUSAL_TILE}; "
                       f"got Nq={nq}, Nk={nk}")
    return True, ""


def cute_varlen_fwd_preferred(q: torch.Tensor, v: torch.Tensor) -> tuple[bool, str]:
    """(ok, reason): whether "auto" should run a supported call on the CuTe varlen forward.

    Measured on H200 (``bench_cute_varlen.py --head-dims``, B=1152, H=4, bf16 gelu_tanh, lengths up to
    256..2048): at D = Dv = 256 the wide-head tiles ran 0.99-1.73x Triton's
    varlen forward, at D = 128, Dv = 256 0.48-1.22x (behind at short samples), so unequal head dims past 128
    keep Triton's."""
    if max(q.shape[-1], v.shape[-1]) > 128 and q.shape[-1] != v.shape[-1]:
        return False, ("unequal head dims past 128 take the CuTe varlen forward only under backend='cute' "
                       "(behind Triton's at short samples)")
    return True, ""


def gdpa_varlen_fwd_cute(qs: VarlenSide, ks: VarlenSide, v: torch.Tensor, out: VarlenSide, order: torch.Tensor,
                         activation: ActivationName, scale: float, post_scale: float, negative_slope: float,
                         causal: bool = False, band: tuple[int, int] | None = None,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """Writes ``out.tensor`` (the queries' layout, Dv wide; rows past each sample's length untouched) from the
    sides of a ``cute_varlen_fwd_support``-checked call; returns it. ``causal``: the bottom-right aligned mask in
    each sample (``varlen_causal_support``'s cases); ``band``: (left, right), the band mask in its place
    (``varlen_band``); ``bias``: one element, added to every score, or a tensor ``varlen_bias_support`` takes,
    sample z's query i and key j adding ``bias[z, h, i, j]`` (broadcast over its dims of one)."""
    q, k, o = qs.tensor, ks.tensor, out.tensor
    num_m = -(-qs.max_len // _TILE_M)
    tiles = num_m * q.shape[-2] * qs.batch
    if o.numel() == 0 or tiles == 0:
        return o
    if k.numel() == 0 or v.numel() == 0:
        # no sample has keys (and the descriptors would have no memory to point at)
        return o.zero_()
    rows = torch.stack([qs.starts, qs.lengths, ks.starts, ks.lengths, order.to(torch.int32)])
    tensor_bias = bias if bias is not None and bias.numel() != 1 else None
    offset = bias if tensor_bias is None else None
    fn = compile_fwd(q.dtype, q.shape[-1], activation, head_dim_v=v.shape[-1], varlen=True,
                     causal=causal and band is None, band=band is not None, score_offset=offset is not None,
                     score_bias=tensor_bias is not None)
    # jagged samples: the later query tile positions exist only in the longer ones (full samples lose one CTA's
    # 0.8%, measured 2%)
    num_ctas = persistent_grid(tiles, torch.cuda.get_device_properties(q.device).multi_processor_count, num_m, True)
    fn(*(row_modes(t) for t in (q, k, v, o)), scale, post_scale, negative_slope, num_ctas, rows, num_m,
       *(band or (None, None)), *offset_args(offset), None if tensor_bias is None else score_bias_modes(tensor_bias))
    return o
