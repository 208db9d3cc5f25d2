"""Launcher of the CuTe-DSL Hopper forward over varlen batches (``GdpaFwdSm90`` with ``varlen``): the call on the
rows the varlen schedule gives (``kernels/triton/varlen_schedule.py``: each
sample's first row and length on both sides, samples longest first).

Each side is a jagged ``[total, H, D]`` tensor or a dense ``[B or 1, N, H, D]`` one (padded batches pass their
valid lengths); the kernel reads each sample's rows through TMA descriptors bounded at the sample's end, so a
sample never reads or writes another's rows, and its persistent CTAs skip the query tiles past each sample's
length. One compile per (dtype, head dims, activation, mask, kind of bias), shared with nothing else: the keys are
always masked (under ``causal`` by the diagonal's mask, as in the dense kernel). The mask is none, the causal mask where
every sample's diagonal is known to align with the tiles (``varlen_causal_support``), or else a band around each
sample's diagonal (``varlen_band``: the causal mask at any Nk - Nq, sliding windows, HSTU's ``max_attn_len``) whose
bounds the kernels take at run time. Which calls it takes is ``varlen_support``'s; the mask is ``varlen_plan``'s.

``gdpa_varlen_fwd_cute_sm100`` launches the Blackwell forward (``GdpaFwdSm100`` with ``varlen``) on the same rows
and order: persistent CTAs walk the (query tile, head, sample) tiles, longest samples first, the causal mask and
windows as a band at any per-sample Nk - Nq. Which calls it takes is ``varlen_support.sm100_varlen_fwd_support``'s;
on sm_100 the dispatch runs it once the call's build (``plan_varlen_fwd_sm100``) has passed its self-check
(``lowering/sm100_varlen_forward.py``).
"""

from __future__ import annotations

import torch

from ..activations import ActivationName
from ..common.varlen_rows import VarlenSide
from .fwd_plan import Sm100FwdPlan, persistent_grid, plan_fwd, plan_fwd_sm100
from .gdpa_fwd import sm100_band, sm100_bias_arg, sm100_bias_name
from .kernel_args import FWD_ARGS, FWD_SM100_ARGS, offset_arg, row_modes, score_bias_modes
from .kernel_build import compile_fwd, compile_fwd_sm100
from .operand_views import is_tensor_bias

_TILE_M = 128


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
    tensor_bias = bias if is_tensor_bias(bias) else None
    offset = bias if tensor_bias is None else None
    plan = plan_fwd(q.dtype, q.shape[-1], activation, v.shape[-1], varlen=True, causal=causal and band is None,
                    band=band is not None, score_offset=offset is not None, score_bias=tensor_bias is not None)
    # jagged samples: the later query tile positions exist only in the longer ones (full samples lose one CTA's
    # 0.8%, measured 2%)
    num_ctas = persistent_grid(tiles, torch.cuda.get_device_properties(q.device).multi_processor_count, num_m, True)
    band_left, band_right = band or (None, None)
    compile_fwd(plan)(*FWD_ARGS.values(
        plan, q=row_modes(q), k=row_modes(k), v=row_modes(v), out=row_modes(o), scale=scale, post_scale=post_scale,
        slope=negative_slope, num_ctas=num_ctas, rows=rows, num_m=num_m, band_left=band_left, band_right=band_right,
        offset=offset_arg(offset), bias=None if tensor_bias is None else score_bias_modes(tensor_bias)))
    return o


def gdpa_varlen_fwd_cute_sm100(qs: VarlenSide, ks: VarlenSide, v: torch.Tensor, out: VarlenSide, order: torch.Tensor,
                               activation: ActivationName, scale: float, post_scale: float, negative_slope: float,
                               causal: bool = False, window: tuple[int, int] = (-1, -1),
                               bias: torch.Tensor | None = None, plan: Sm100FwdPlan | None = None,
                               ctas: int | None = None) -> torch.Tensor:
    """The Blackwell forward (``GdpaFwdSm100`` with ``varlen``) on the sides of a
    ``varlen_support.sm100_varlen_fwd_support``-checked call: writes ``out.tensor`` (rows past each sample's length
    untouched) and returns it. A persistent grid (``Sm100FwdPlan.grid``) walks the (query tile, head, sample) tiles,
    the samples in ``order`` (longest first), skipping the query tiles past each sample's length.
    ``causal``, ``window``: the bottom-right aligned mask and the band around it in each sample, at any Nk - Nq;
    ``bias``: one element, or a tensor ``sm100_varlen_fwd_support`` takes, sample z's query i and key j adding
    ``bias[z, h, i, j]``. ``plan``: the build to run (None: ``plan_varlen_fwd_sm100``'s). ``ctas``: the grid (None:
    the plan's for the device; a few make each CTA walk several tiles, as the self-check wants). Not yet run on a
    Blackwell GPU: the dispatch checks each build's results on the device first."""
    q, k, o = qs.tensor, ks.tensor, out.tensor
    num_m = -(-qs.max_len // _TILE_M)
    if o.numel() == 0 or num_m * qs.batch == 0:
        return o
    if k.numel() == 0 or v.numel() == 0:
        return o.zero_()
    rows = torch.stack([qs.starts, qs.lengths, ks.starts, ks.lengths, order.to(torch.int32)])
    plan = plan or plan_varlen_fwd_sm100(q.dtype, q.shape[-1], activation, causal, window, bias)
    causal, bounds = sm100_band(causal, window)
    band_left, band_right = bounds or (None, None)
    tiles = num_m * q.shape[-2] * qs.batch
    if ctas is None:
        num_ctas = plan.grid(tiles, num_m, torch.cuda.get_device_properties(q.device).multi_processor_count)
    else:
        num_ctas = max(1, min(ctas, tiles))
    compile_fwd_sm100(plan)(*FWD_SM100_ARGS.values(
        plan, q=row_modes(q), k=row_modes(k), v=row_modes(v), out=row_modes(o), scale=scale, post_scale=post_scale,
        slope=negative_slope, num_ctas=num_ctas, rows=rows, num_m=num_m, band_left=band_left, band_right=band_right,
        bias=sm100_bias_arg(bias, qs.max_len, ks.max_len)))
    return o


def plan_varlen_fwd_sm100(dtype: torch.dtype, head_dim: int, activation: ActivationName, causal: bool,
                          window: tuple[int, int], bias: torch.Tensor | None) -> Sm100FwdPlan:
    """The build ``gdpa_varlen_fwd_cute_sm100`` runs for a call of this dtype, head dim, masks and bias: the one its
    self-check keys on."""
    causal, bounds = sm100_band(causal, window)
    return plan_fwd_sm100(dtype, head_dim, activation, causal=causal, window=bounds is not None,
                          bias=sm100_bias_name(bias), varlen=True)
