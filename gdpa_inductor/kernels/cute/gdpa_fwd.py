"""Launchers of the CuTe-DSL forwards on a dense batch: plan the call (``fwd_plan``), take its build (``kernel_build``)
and launch it with the arguments of its schema (``kernel_args``). Which calls they take is ``fwd_support``'s. The
Hopper forward and, on sm_100 once the call's build has passed its self-check (``lowering/sm100_forward.py``), the
Blackwell one (``gdpa_fwd_cute_sm100``, with the causal mask and a bias too) are the dispatch's."""

from __future__ import annotations

import torch

from ..activations import ActivationName
from ..common.window_bounds import band_limits
from .fwd_plan import SM100_KEY_TILE, FwdPlan, Sm100FwdPlan, key_tile, persistent_grid, plan_fwd, plan_fwd_sm100
from .kernel_args import FWD_ARGS, FWD_SM100_ARGS, dense_modes, offset_arg, score_bias_modes, sm100_bias_words
from .kernel_build import compile_fwd, compile_fwd_sm100
from .operand_views import bias_4d, flatten_batch, is_tensor_bias


def plan_dense_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: ActivationName, causal: bool = False,
                   bias: torch.Tensor | None = None) -> FwdPlan:
    """The plan of ``gdpa_fwd_cute``'s call on these [Z, H, N, D] operands."""
    return plan_fwd(q.dtype, q.shape[-1], activation, v.shape[-1],
                    mask_keys=k.shape[2] % key_tile(q.shape[-1], v.shape[-1]) != 0, causal=causal,
                    score_offset=bias is not None and not is_tensor_bias(bias), score_bias=is_tensor_bias(bias))


def gdpa_fwd_cute(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: ActivationName, scale: float, post_scale: float,
    negative_slope: float, causal: bool = False, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
    plan: FwdPlan | None = None,
) -> torch.Tensor:
    """q [Z, H, Nq, D], k [Z, Hkv, Nk, D], v [Z, Hkv, Nk, Dv] (checked by ``fwd_support.fwd_supported``) -> out
    [Z, H, Nq, Dv]. ``causal``: the bottom-right aligned causal mask. ``bias``: one element (any float dtype), added
    to every score, or a tensor ``score_bias_support`` takes (in its 4-D form: leading dims of 1 or Z and of 1 or H),
    added to each. ``out``: a tensor of that shape and q's dtype to write (TMA's layout rules, as for q), else a
    new one. ``plan``: the build to run (None: ``plan_dense_fwd``'s; another schedule of the same call compares
    schedules)."""
    if out is None:
        out = torch.empty((*q.shape[:3], v.shape[-1]), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if k.shape[2] == 0:
        return out.zero_()
    plan = plan_dense_fwd(q, k, v, activation, causal, bias) if plan is None else plan
    num_m = -(-q.shape[2] // 128)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    num_ctas = persistent_grid(num_m * q.shape[1] * q.shape[0], sms, num_m, causal)
    tensor_bias = bias if is_tensor_bias(bias) else None
    compile_fwd(plan)(*FWD_ARGS.values(
        plan, q=dense_modes(q), k=dense_modes(k), v=dense_modes(v), out=dense_modes(out), scale=scale,
        post_scale=post_scale, slope=negative_slope, num_ctas=num_ctas,
        offset=offset_arg(None if tensor_bias is not None else bias),
        bias=None if tensor_bias is None else score_bias_modes(tensor_bias)))
    return out


def gdpa_fwd_cute_op(q, k, v, activation: ActivationName, scale: float, post_scale: float, negative_slope: float,
                     causal: bool = False, bias: torch.Tensor | None = None):
    """The op's forward on the CuTe kernel: operands in the op's [..., H, N, D] layout, batch dims broadcasting
    (``fwd_support.cute_fwd_support`` checked) -> [*batch, H, Nq, Dv]."""
    (q4, k4, v4), batch = flatten_batch(q, k, v)
    out = gdpa_fwd_cute(q4, k4, v4, activation, scale, post_scale, negative_slope, causal=causal,
                        bias=bias_4d(bias, batch, q4.shape[2]))
    return out.view(*batch, *out.shape[1:])


def sm100_bias_arg(bias: torch.Tensor | None, nq: int, nk: int) -> torch.Tensor | None:
    """The Blackwell forward's bias argument (``sm100_bias_words``) of a bias ``sm100_bias_support`` took: a tensor
    as it is, one element as an fp32 row of ``nk`` copies seen as ``nq`` rows of stride 0 (the kernel reads a bias
    per score only)."""
    if bias is None:
        return None
    if bias.numel() == 1:
        bias = bias.detach().reshape(1).float().expand(nk).contiguous().view(1, 1, 1, nk).expand(1, 1, nq, nk)
    return sm100_bias_words(bias)


def sm100_bias_name(bias: torch.Tensor | None) -> str:
    """The plan's ``bias`` of a call's bias: its dtype's name, fp32 for one element, "" for none."""
    if bias is None:
        return ""
    return "float32" if bias.numel() == 1 else str(bias.dtype).removeprefix("torch.")


def sm100_band(causal: bool, window: tuple[int, int]) -> tuple[bool, tuple[int, int] | None]:
    """(causal, run-time bounds): the band of a call with ``causal`` and the op's ``window`` (-1: unbounded), as the
    Blackwell forward takes it; a window carries the causal bound in its bounds (``band_limits``)."""
    if tuple(window) == (-1, -1):
        return causal, None
    return False, band_limits(causal, window)


def gdpa_fwd_cute_sm100(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activation: ActivationName, scale: float, post_scale: float,
    negative_slope: float, causal: bool = False, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
    plan: Sm100FwdPlan | None = None, window: tuple[int, int] = (-1, -1), ctas: int | None = None,
) -> torch.Tensor:
    """The Blackwell forward (``GdpaFwdSm100``) on q [Z, H, Nq, D], k [Z, Hkv, Nk, D], v [Z, Hkv, Nk, D] (checked
    by ``fwd_support.sm100_fwd_supported``) -> out [Z, H, Nq, D]: the (128-row query tile, head, sample) tiles
    walked by a persistent grid of at most the CTAs the SMs hold at once (``Sm100FwdPlan.grid``).
    ``causal``: the bottom-right aligned causal mask; ``window``: (left, right) around that diagonal, -1 unbounded
    (the varlen op's windows); ``bias``: one element, or a tensor ``sm100_bias_support`` takes in its 4-D form
    (leading dims of 1 or Z and of 1 or H), added to each score. ``plan``: the build to run (None:
    ``plan_fwd_sm100``'s, 128-key tiles, the mask of keys past Nk where Nk is not a multiple of them). ``ctas``: the
    grid (at most the tiles; None: ``Sm100FwdPlan.grid``'s), so that a check on small inputs can still have each CTA
    walk several tiles. Not yet run on a Blackwell GPU: the dispatch checks each build's results on the device first."""
    if out is None:
        out = torch.empty((*q.shape[:3], v.shape[-1]), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if k.shape[2] == 0:
        return out.zero_()
    causal, bounds = sm100_band(causal, window)
    if plan is None:
        plan = plan_fwd_sm100(q.dtype, q.shape[-1], activation, mask_keys=k.shape[2] % SM100_KEY_TILE != 0,
                              causal=causal, window=bounds is not None, bias=sm100_bias_name(bias))
    band_left, band_right = bounds or (None, None)
    num_m = -(-q.shape[2] // 128)
    tiles = num_m * q.shape[1] * q.shape[0]
    if ctas is None:
        num_ctas = plan.grid(tiles, num_m, torch.cuda.get_device_properties(q.device).multi_processor_count)
    else:
        num_ctas = max(1, min(ctas, tiles))
    compile_fwd_sm100(plan)(*FWD_SM100_ARGS.values(
        plan, q=dense_modes(q), k=dense_modes(k), v=dense_modes(v), out=dense_modes(out), scale=scale,
        post_scale=post_scale, slope=negative_slope, num_ctas=num_ctas, band_left=band_left, band_right=band_right,
        bias=sm100_bias_arg(bias, q.shape[2], k.shape[2])))
    return out


def plan_dense_fwd_sm100(q: torch.Tensor, k: torch.Tensor, activation: ActivationName, causal: bool = False,
                         bias: torch.Tensor | None = None) -> Sm100FwdPlan:
    """The plan of ``gdpa_fwd_cute_sm100``'s call on these [Z, H, N, D] operands, with ``causal`` and ``bias``: the
    build its self-check keys on."""
    return plan_fwd_sm100(q.dtype, q.shape[-1], activation, mask_keys=k.shape[2] % SM100_KEY_TILE != 0,
                          causal=causal, bias=sm100_bias_name(bias))


def gdpa_fwd_cute_sm100_op(q, k, v, activation: ActivationName, scale: float, post_scale: float,
                           negative_slope: float, causal: bool = False, bias: torch.Tensor | None = None,
                           plan: Sm100FwdPlan | None = None, ctas: int | None = None):
    """The op's forward on the Blackwell kernel: operands in the op's [..., H, N, D] layout, batch dims broadcasting,
    and the op's bias (``fwd_support.sm100_fwd_supported`` checked on their 4-D views) -> [*batch, H, Nq, D].
    ``plan``: the build to run (None: ``plan_dense_fwd_sm100``'s, the one the self-check passed); ``ctas`` as for
    ``gdpa_fwd_cute_sm100``."""
    (q4, k4, v4), batch = flatten_batch(q, k, v)
    bias4 = bias_4d(bias, batch, q4.shape[2])
    out = gdpa_fwd_cute_sm100(q4, k4, v4, activation, scale, post_scale, negative_slope, causal=causal, bias=bias4,
                              plan=plan or plan_dense_fwd_sm100(q4, k4, activation, causal, bias4), ctas=ctas)
    return out.view(*batch, *out.shape[1:])
