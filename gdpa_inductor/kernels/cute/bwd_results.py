"""What the host does after the CuTe backward: dQ scaled and rounded from the kernel's fp32 sums (in rows, or in the
80-row tiles' fragment order), and dbias summed over the bias's broadcast dims, scaled and rounded."""

from __future__ import annotations

import torch

from ..activations import ActivationName
from ..common import dq_fragments, dq_round
from .bwd_plan import LONG_QUERY_TILE


def _ds_factor(activation: ActivationName, scale: float, post_scale: float) -> float:
    """dS's scale: scale, post_scale and act''s constant factor, multiplied in fp32 as the kernel multiplies them for
    dK."""
    from .activation_math import backward_form

    factor = torch.tensor(scale, dtype=torch.float32) * torch.tensor(post_scale, dtype=torch.float32)
    return (factor * backward_form(activation).grad_factor).item()


def dq_of_sums(sums: torch.Tensor, dtype: torch.dtype, activation: ActivationName, scale: float,
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


def dq_of_fragments(sums: torch.Tensor, num_queries: int, dtype: torch.dtype, activation: ActivationName, scale: float,
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


def dbias_of(ds: torch.Tensor, bias: torch.Tensor, sums: str, activation: ActivationName, post_scale: float,
             one_row: bool = False) -> torch.Tensor:
    """dBias of ``bias`` ([Zb, Hb, Nq, Nk] or fewer leading dims) from ``dbias_buffer``'s tensor for ``sums``, filled
    by the kernel without act''s constant factor and post_scale (dK and dQ take them at the end): the fp32 sums
    transposed back, scaled and rounded once, or the [Z, H, Nq, Nk] dS buffer summed (``_sum_to``) and scaled.
    ``one_row``: the bias is one row seen as Nq rows (``operand_views.bias_4d``): its one row's gradient, summed over
    the queries before the one rounding."""
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


def _sum_to(ds: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """[Z, H, Nq, Nk] dS summed over the dims a bias of ``shape`` ([Zb, Hb, Nq, Nk]) broadcasts along, accumulated in
    fp32 and rounded once to dS's dtype (dS itself where it broadcasts along none; the caller's scale rounds again).
    dS is the backward's largest tensor: with an fp32 sum, scale and cast in its place the backward with dbias ran
    4-7% slower (H200, bias per sample, 1024² to 2048²)."""
    dims = [i for i, (n, m) in enumerate(zip(shape, ds.shape)) if n == 1 and m > 1]
    return ds.sum(dims, keepdim=True) if dims else ds
