"""Launchers of the CuTe-DSL backwards on a dense batch: plan the call (``bwd_plan``), allocate dQ, dK, dV and
dbias's buffer, launch the build (``kernel_build``) with its schema's arguments (``kernel_args``) and hand the
kernel's sums to the host's last steps (``bwd_results``). Which calls they take is ``bwd_support``'s. The Hopper
backward is the dispatch's; the Blackwell one (``gdpa_bwd_cute_sm100``) the dispatch's on sm_100 once its build has
passed its first-use self-check (``lowering/sm100_backward.py``)."""

from __future__ import annotations

import torch

from ..activations import ActivationName
from ..common.layout import tma_layout
from .bwd_plan import KEY_TILE, QUERY_TILE, SM100_BWD_TILE, BwdPlan, Sm100BwdPlan, plan_bwd, plan_bwd_sm100
from .bwd_results import dbias_of, dq_of_fragments, dq_of_sums
from .dbias_plan import bias_leading_dims, dbias_way
from .dq_workspace import zeroed_dq_sums
from .gdpa_fwd import sm100_band, sm100_bias_name
from .kernel_args import BWD_SM100_ARGS, TMA_COLUMNS, bias_tile_modes, dense_modes, offset_arg, padded
from .kernel_build import bwd_args, compile_bwd, compile_bwd_sm100
from .operand_views import bias_4d, flatten_batch, is_tensor_bias


def dbias_buffer(sums: str, num_samples: int, num_heads: int, bias: torch.Tensor, zeros: bool) -> torch.Tensor:
    """The tensor the CuTe backward sums dbias of ``bias`` ([Zb, Hb, rows, columns] or fewer leading dims) in
    (``sums``: one of ``DBIAS_SUMS``): the zero-filled fp32 sums, transposed (the kernel's (rows, columns, Hb, Zb)
    mode order, ``dense_modes``, then has the columns as rows and adds two neighbouring queries at once), or a
    [Z, H, rows, columns] dS buffer in the bias's dtype, zero-filled where ``zeros`` (where no CTA may store)."""
    rows, cols = bias.shape[-2:]
    if sums == "atomic":
        zb, hb = bias_leading_dims(bias.shape)
        return torch.zeros((zb, hb, padded(cols, KEY_TILE), padded(rows, QUERY_TILE)), dtype=torch.float32,
                           device=bias.device)
    # rows padded for the TMA stores, seen as the bias's columns
    buffer = (torch.zeros if zeros else torch.empty)((num_samples, num_heads, rows, padded(cols, TMA_COLUMNS)),
                                                     dtype=bias.dtype, device=bias.device)
    return buffer[..., :cols]


def plan_dense_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: ActivationName, causal: bool = False,
                   bias: torch.Tensor | None = None, bias_grad: bool = False) -> BwdPlan:
    """The plan of ``gdpa_bwd_cute``'s call on these [Z, H, N, D] operands (the bias in its 4-D form)."""
    tensor_bias = is_tensor_bias(bias)
    if bias_grad and not tensor_bias:
        raise ValueError("bias_grad=True needs a bias tensor (the CuTe backward's bias gradient is a tensor's)")
    atomic = bias_grad and dbias_way(q.shape[0], q.shape[1], bias, varlen=False) == "atomic"
    return plan_bwd(q.dtype, q.shape[-1], activation, v.shape[-1], num_queries=q.shape[2], num_keys=k.shape[2],
                    causal=causal, score_offset=bias is not None and not tensor_bias, score_bias=tensor_bias,
                    bias_grad=bias_grad, dbias_atomic=atomic)


def gdpa_bwd_cute(
    q, k, v, grad_out, activation: ActivationName, scale: float, post_scale: float, negative_slope: float,
    causal: bool = False, bias: torch.Tensor | None = None, bias_grad: bool = False, one_row_bias: bool = False,
    plan: BwdPlan | None = None,
):
    """q [Z, H, Nq, D], k [Z, Hkv, Nk, D], v [Z, Hkv, Nk, Dv], grad_out [Z, H, Nq, Dv] (``bwd_support.bwd_supported``
    checked) -> (dq, dk, dv, dbias or None). ``causal``: the bottom-right aligned mask. ``bias``: one element (any
    float dtype), added to every score (no gradient), or a tensor ``bias_tensor_bwd_support`` takes ([Zb, Hb, Nq,
    Nk], Zb 1 or Z, Hb 1 or H), added to each; ``bias_grad``: its gradient is wanted (a tensor's only), dbias in its
    shape and dtype. ``one_row_bias``: the bias is one row seen as Nq rows of stride 0 (``operand_views.bias_4d``),
    dbias that row's, summed over the queries (a bias tensor the caller expanded itself gets one gradient per row).
    ``plan``: the build to run (None: ``plan_dense_bwd``'s; another of the same call compares ways of summing dQ or
    dbias, or query tiles)."""
    z, h, nq, d = q.shape
    hkv, nk, d_v = k.shape[1], k.shape[2], v.shape[-1]
    plan = plan_dense_bwd(q, k, v, activation, causal, bias, bias_grad) if plan is None else plan
    group = h // hkv
    if group > 1:
        # per query head, summed over each kv head's group below
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    grad_out = grad_out if tma_layout(grad_out) else grad_out.contiguous()
    tensor_bias = bias if is_tensor_bias(bias) else None
    # 80-row tiles: the fp32 sums in whole tiles, in the kernel's order (``dq_of_fragments``)
    dq_rows = nq if plan.query_tile == QUERY_TILE else padded(nq, plan.query_tile)
    dq_out, counts = None, None
    if plan.dq_last_round:
        # the kernel leaves the sums and counts zero again: kept between calls, no zero fill
        dq_acc, counts = zeroed_dq_sums((z, h, dq_rows, d), z * h, q.device)
        dq_out = torch.empty((z, h, nq, d), dtype=q.dtype, device=q.device)
    else:
        dq_acc = torch.zeros((z, h, dq_rows, d), dtype=q.dtype if plan.dq_sums == "in_place" else torch.float32,
                             device=q.device)
    dk = torch.empty((z, h, nk, d), dtype=q.dtype, device=q.device)
    dv = torch.empty((z, h, nk, d_v), dtype=q.dtype, device=q.device)
    ds, sums = None, None
    if plan.bias_grad:
        sums = "atomic" if plan.dbias_atomic else "buffer"
        # a causal CTA skips the query tiles before its diagonal, whose dS is zero
        ds = dbias_buffer(sums, z, h, tensor_bias, zeros=causal)
    if dq_acc.numel() and dk.numel():
        compile_bwd(plan)(*bwd_args(plan).values(
            plan, q=dense_modes(q), k=dense_modes(k), v=dense_modes(v), dout=dense_modes(grad_out),
            dq=dense_modes(dq_acc), dk=dense_modes(dk), dv=dense_modes(dv), scale=scale, post_scale=post_scale,
            slope=negative_slope, offset=offset_arg(None if tensor_bias is not None else bias),
            bias=None if tensor_bias is None else bias_tile_modes(tensor_bias),
            dbias=None if ds is None else dense_modes(ds), dq_out=None if dq_out is None else dense_modes(dq_out),
            dq_count=counts))
    else:
        for t in (dk, dv, dq_out, ds):
            if t is not None:
                t.zero_()
    if plan.dq_sums == "in_place":
        dq = dq_acc
    elif dq_out is not None:
        dq = dq_out
    elif plan.query_tile == QUERY_TILE:
        dq = dq_of_sums(dq_acc, q.dtype, activation, scale, post_scale)
    else:
        dq = dq_of_fragments(dq_acc, nq, q.dtype, activation, scale, post_scale, plan.query_tile)
    if group > 1:
        dk = dk.view(z, hkv, group, nk, d).sum(2)
        dv = dv.view(z, hkv, group, nk, d_v).sum(2)
    dbias = None if ds is None else dbias_of(ds, tensor_bias, sums, activation, post_scale, one_row_bias)
    return dq, dk, dv, dbias


def gdpa_bwd_cute_op(grad_out, q, k, v, activation: ActivationName, scale: float, post_scale: float,
                     negative_slope: float, causal: bool = False, bias: torch.Tensor | None = None,
                     bias_grad: bool = False):
    """The op's backward on the CuTe kernel: operands in the op's [..., H, N, D] layout, of one batch shape
    (``bwd_support.cute_bwd_support`` checked: no broadcast dims) -> (dq, dk, dv, dbias or None) in the inputs'
    shapes."""
    (q4, k4, v4), batch = flatten_batch(q, k, v)
    do4 = grad_out.reshape(*q4.shape[:3], v4.shape[-1])
    bias4 = bias_4d(bias, batch, q4.shape[2])
    one_row = is_tensor_bias(bias) and (bias.dim() < 2 or bias.shape[-2] == 1) and q4.shape[2] > 1
    dq, dk, dv, dbias = gdpa_bwd_cute(q4, k4, v4, do4, activation, scale, post_scale, negative_slope, causal=causal,
                                      bias=bias4, bias_grad=bias_grad, one_row_bias=one_row)
    if dbias is not None:
        # a bias whose batch dims flattened only by a copy (``bias_4d``) got one gradient per sample
        dbias = dbias.view(bias.shape) if dbias.numel() == bias.numel() else dbias.reshape(
            *batch, *dbias.shape[1:]).sum_to_size(bias.shape)
    return dq, dk, dv, dbias


def gdpa_bwd_cute_sm100(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, activation: ActivationName,
    scale: float, post_scale: float, negative_slope: float, plan: Sm100BwdPlan | None = None, causal: bool = False,
    window: tuple[int, int] = (-1, -1), bias: torch.Tensor | None = None, bias_grad: bool = False,
    one_row_bias: bool = False, ctas: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The Blackwell backward (``GdpaBwdSm100``) on q [Z, H, Nq, D], k [Z, Hkv, Nk, D], v [Z, Hkv, Nk, D], grad_out
    [Z, H, Nq, D] (checked by ``bwd_support.sm100_bwd_supported``) -> (dq, dk, dv): its work tiles (128-key tile,
    head, sample) walked by a persistent grid of one CTA an SM at most (``Sm100BwdPlan.grid``); dQ summed unscaled
    in fp32 by the kernel, scaled and rounded here (``dq_of_sums``). Grouped heads run per query head on K and V
    repeated, dK and dV summed over each group after. ``causal``: the bottom-right aligned causal mask; ``window``:
    (left, right) around that diagonal, -1 unbounded. ``bias``: one element (no gradient), or a tensor
    ``sm100_bwd_bias_support`` takes ([Zb, Hb, Nq, Nk], keys contiguous), added to each score;
    ``bias_grad``: its gradient (dbias in its shape and dtype, summed from a zero-filled [Z, H, Nq, Nk] dS buffer);
    ``one_row_bias`` as for ``gdpa_bwd_cute``. ``plan``: the build to run (None: ``plan_bwd_sm100``'s, the mask of
    queries past Nq where Nq is not a multiple of the 128-row query tile). ``ctas``: the grid (at most the tiles;
    None: ``Sm100BwdPlan.grid``'s), so that a check on small inputs can still have each CTA walk several tiles. Not
    yet run on a Blackwell GPU: the dispatch checks each build's results on the device first."""
    z, h, nq, d = q.shape
    hkv, nk, d_v = k.shape[1], k.shape[2], v.shape[-1]
    dk = torch.empty((z, h, nk, d), dtype=q.dtype, device=q.device)
    dv = torch.empty((z, h, nk, d_v), dtype=q.dtype, device=q.device)
    tensor_bias = bias if is_tensor_bias(bias) else None
    if bias_grad and tensor_bias is None:
        raise ValueError("bias_grad=True needs a bias tensor (the CuTe backward's bias gradient is a tensor's)")
    if dk.numel() == 0 or nq == 0:
        # no key tile to run, or no query to add anything: the gradients are zero
        dbias = None if not bias_grad else dbias_of(dbias_buffer("buffer", z, h, tensor_bias, zeros=True),
                                                     tensor_bias, "buffer", activation, post_scale, one_row_bias)
        return torch.zeros_like(q), k.new_zeros(k.shape), v.new_zeros(v.shape), dbias
    causal, bounds = sm100_band(causal, window)
    if plan is None:
        plan = plan_dense_bwd_sm100(q, activation, causal, bounds is not None, sm100_bias_name(bias), bias_grad)
    band_left, band_right = bounds or (None, None)
    group = h // hkv
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    grad_out = grad_out if tma_layout(grad_out) else grad_out.contiguous()
    dq_acc = torch.zeros((z, h, nq, d), dtype=torch.float32, device=q.device)
    # band-skipped tiles and rows past Nq store no dS
    ds = dbias_buffer("buffer", z, h, tensor_bias, zeros=True) if bias_grad else None
    num_n = -(-nk // SM100_BWD_TILE)
    compile_bwd_sm100(plan)(*BWD_SM100_ARGS.values(
        plan, q=dense_modes(q), k=dense_modes(k), v=dense_modes(v), dout=dense_modes(grad_out),
        dq=dense_modes(dq_acc), dk=dense_modes(dk), dv=dense_modes(dv), scale=scale, post_scale=post_scale,
        slope=negative_slope, num_ctas=sm100_bwd_grid(plan, num_n * h * z, num_n, q.device, ctas),
        band_left=band_left, band_right=band_right, bias=sm100_bwd_bias_arg(bias, nq, nk),
        dbias=None if ds is None else dense_modes(ds)))
    dq = dq_of_sums(dq_acc, q.dtype, activation, scale, post_scale)
    if group > 1:
        dk = dk.view(z, hkv, group, nk, d).sum(2)
        dv = dv.view(z, hkv, group, nk, d_v).sum(2)
    dbias = None if ds is None else dbias_of(ds, tensor_bias, "buffer", activation, post_scale, one_row_bias)
    return dq, dk, dv, dbias


def sm100_bwd_grid(plan: Sm100BwdPlan, tiles: int, num_n: int, device: torch.device, ctas: int | None) -> int:
    """The Blackwell backward's grid over ``tiles`` work tiles of ``num_n`` key tiles a head and sample: ``ctas``
    (at most the tiles), or None for the plan's on the device's SMs (``Sm100BwdPlan.grid``)."""
    if ctas is not None:
        return max(1, min(ctas, tiles))
    return plan.grid(tiles, num_n, torch.cuda.get_device_properties(device).multi_processor_count)


def sm100_bwd_bias_arg(bias: torch.Tensor | None, nq: int, nk: int) -> torch.Tensor | None:
    """The Blackwell backward's bias argument: a tensor's (Nq, Nk, Hb, Zb) modes, or one element as an fp32 row of
    Nk keys read by every query (the kernel reads a key's values with the keys contiguous)."""
    if bias is None:
        return None
    if bias.numel() == 1:
        row = bias.detach().float().reshape(1, 1, 1, 1).expand(1, 1, 1, nk).contiguous()
        return dense_modes(row.expand(1, 1, nq, nk))
    return dense_modes(bias.detach())


def plan_dense_bwd_sm100(q: torch.Tensor, activation: ActivationName, causal: bool = False, window: bool = False,
                         bias: str = "", bias_grad: bool = False) -> Sm100BwdPlan:
    """The plan of ``gdpa_bwd_cute_sm100``'s call on this [Z, H, Nq, D] q: the build its self-check keys on (the mask
    of queries past Nq where Nq is not a multiple of the 128-row query tile, the band's kind, the bias's element
    type by ``sm100_bias_name`` and whether its gradient is wanted)."""
    return plan_bwd_sm100(q.dtype, q.shape[-1], activation, mask_queries=q.shape[2] % SM100_BWD_TILE != 0,
                          causal=causal, window=window, bias=bias, bias_grad=bias_grad)


def gdpa_bwd_cute_sm100_op(grad_out, q, k, v, activation: ActivationName, scale: float, post_scale: float,
                           negative_slope: float, causal: bool = False, bias: torch.Tensor | None = None,
                           bias_grad: bool = False):
    """The op's backward on the Blackwell kernel: operands in the op's [..., H, N, D] layout, batch dims broadcasting
    (``bwd_support.sm100_bwd_supported`` checked on their 4-D views) -> (dq, dk, dv, dbias or None) in the inputs'
    shapes (the gradient of an operand broadcast over batch dims summed over them)."""
    (q4, k4, v4), batch = flatten_batch(q, k, v)
    do4 = grad_out.reshape(*q4.shape[:3], v4.shape[-1])
    bias4 = bias_4d(bias, batch, q4.shape[2])
    one_row = is_tensor_bias(bias) and (bias.dim() < 2 or bias.shape[-2] == 1) and q4.shape[2] > 1
    plan = plan_dense_bwd_sm100(q4, activation, causal, False, sm100_bias_name(bias4), bias_grad)
    *grads, dbias = gdpa_bwd_cute_sm100(q4, k4, v4, do4, activation, scale, post_scale, negative_slope, plan=plan,
                                        causal=causal, bias=bias4, bias_grad=bias_grad, one_row_bias=one_row)
    dq, dk, dv = (g.reshape(*batch, *g.shape[1:]).sum_to_size(t.shape) for g, t in zip(grads, (q, k, v)))
    if dbias is not None:
        dbias = dbias.view(bias.shape) if dbias.numel() == bias.numel() else dbias.reshape(
            *batch, *dbias.shape[1:]).sum_to_size(bias.shape)
    return dq, dk, dv, dbias
