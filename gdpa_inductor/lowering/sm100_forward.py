"""Which dense forward calls the CuTe Blackwell forward (``GdpaFwdSm100``) takes on an sm_100 GPU, the causal mask
and a bias included: those its support check covers, once the build the call would run has passed its first-use
self-check against Triton on the device (``self_check``, with the glue the backward shares in ``sm100_kernels``; the
inputs in ``sm100_forward_cases``). No Blackwell GPU has run the kernel in this project's tests, so no build serves
a call unchecked."""

from __future__ import annotations

import torch

from ..kernels.activations import ActivationName
from . import self_check, sm100_kernels
from .sm100_kernels import CHECK_SHAPES

__all__ = ["CHECK_SHAPES", "forward_check", "may_take", "sm100_forward_support"]


def sm100_forward_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                          activation: ActivationName) -> tuple[bool, str]:
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting) and bias (broadcasting to the
    scores): ``sm100_fwd_supported`` on their 4-D views, then the self-check's verdict on the call's build."""
    from ..kernels.cute.fwd_support import sm100_fwd_supported
    from ..kernels.cute.gdpa_fwd import plan_dense_fwd_sm100
    from ..kernels.cute.operand_views import bias_4d

    views = sm100_kernels.dense_views(q, k, v)
    if views is None:
        return sm100_kernels.NOT_DENSE
    (q4, k4, v4), batch = views
    if bias is not None and bias.numel() != 1:
        scores = (*batch, q.shape[-3], q.shape[-2], k.shape[-2])
        if bias.dim() > len(scores) or any(n not in (1, m) for n, m in zip(bias.shape[::-1], scores[::-1])):
            return False, f"a bias of shape {tuple(bias.shape)} does not broadcast to the scores' {scores}"
    bias4 = bias_4d(bias, batch, q4.shape[2])
    return sm100_kernels.checked_support("forward", sm100_fwd_supported(q4, k4, v4, bias4, causal, activation),
                                         lambda: plan_dense_fwd_sm100(q4, k4, activation, causal, bias4),
                                         forward_check, q.device)


def may_take(q: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName) -> bool:
    """Whether the opaque op could run this forward on the Blackwell kernel (``sm100_kernels.may_take``, with its
    causal mask and bias; the graph may not know Nk's remainder, so a build of either key mask failing sends the call
    to Triton)."""
    from ..kernels.cute.fwd_plan import SM100_HEAD_DIMS, plan_fwd_sm100
    from ..kernels.cute.gdpa_fwd import sm100_bias_name

    if not bias_dtype_taken(q, bias):
        return False
    return sm100_kernels.may_take(
        "forward", q, v, bias, causal, activation, SM100_HEAD_DIMS,
        lambda masked: plan_fwd_sm100(q.dtype, q.shape[-1], activation, mask_keys=masked, causal=causal,
                                      bias=sm100_bias_name(bias)), masks=True)


def bias_dtype_taken(q: torch.Tensor, bias) -> bool:
    """Whether the Blackwell forward has a build for this bias's dtype: none, one element, q's dtype or fp32."""
    return bias is None or bias.numel() == 1 or bias.dtype in (q.dtype, torch.float32)


def forward_check(plan, device: torch.device) -> self_check.Check:
    """The self-check of the Blackwell forward's build ``plan``: that build (not the one a call's shape would pick),
    through the op's launcher, against Triton's forward on ``sm100_forward_cases.dense_cases``."""
    from .sm100_forward_cases import dense_cases, features

    def candidate(q, k, v, bias, activation, scale, post_scale, causal, slope):
        from ..kernels.cute import gdpa_fwd

        return gdpa_fwd.gdpa_fwd_cute_sm100_op(q, k, v, activation, scale, post_scale, slope, causal, bias,
                                               plan=plan, ctas=sm100_kernels.CHECK_CTAS)

    def trusted(*args):
        from ..kernels.triton import gdpa_fwd

        return gdpa_fwd.gdpa_fwd_triton(*args)

    def exact(*args):
        from ..kernels.reference import gdpa_reference

        return gdpa_reference(*args)

    mask = "keys masked past Nk" if plan.mask_keys else "whole key tiles"
    name = sm100_kernels.variant("forward", plan, f"{plan.tile_n}-key tiles", mask, *features(plan))
    return self_check.Check(name, candidate, trusted, exact, lambda: dense_cases(plan, device))
