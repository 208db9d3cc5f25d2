"""Which dense forward calls the CuTe Blackwell forward (``GdpaFwdSm100``) takes on an sm_100 GPU: those its support
check covers, once the build the call would run has passed its first-use self-check against Triton on the device
(``self_check``, with the glue the backward shares in ``sm100_kernels``). No Blackwell GPU has run the kernel in
this project's tests, so no build serves a call unchecked."""

from __future__ import annotations

import torch

from ..kernels.activations import ActivationName
from . import self_check, sm100_kernels
from .sm100_kernels import CHECK_SHAPES, partial_tiles, random_cases, whole_tiles

__all__ = ["CHECK_SHAPES", "forward_check", "may_take", "sm100_forward_support"]


def sm100_forward_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                          activation: ActivationName) -> tuple[bool, str]:
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting): ``sm100_fwd_supported`` on their
    4-D views, then the self-check's verdict on the call's build."""
    from ..kernels.cute.fwd_support import sm100_fwd_supported
    from ..kernels.cute.gdpa_fwd import plan_dense_fwd_sm100

    views = sm100_kernels.dense_views(q, k, v)
    if views is None:
        return sm100_kernels.NOT_DENSE
    if causal or bias is not None:
        # the kernel has both, but its first-use self-check runs the build of neither
        return False, "the CuTe Blackwell forward is self-checked without a causal mask or bias"
    (q4, k4, v4), _ = views
    return sm100_kernels.checked_support("forward", sm100_fwd_supported(q4, k4, v4, bias, causal, activation),
                                         lambda: plan_dense_fwd_sm100(q4, k4, activation), forward_check, q.device)


def may_take(q: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName) -> bool:
    """Whether the opaque op could run this forward on the Blackwell kernel (``sm100_kernels.may_take``; the graph
    may not know Nk's remainder, so a build of either key mask failing sends the call to Triton)."""
    from ..kernels.cute.fwd_plan import SM100_HEAD_DIMS, plan_fwd_sm100

    return sm100_kernels.may_take("forward", q, v, bias, causal, activation, SM100_HEAD_DIMS,
                                  lambda masked: plan_fwd_sm100(q.dtype, q.shape[-1], activation, mask_keys=masked))


def forward_check(plan, device: torch.device) -> self_check.Check:
    """The self-check of the Blackwell forward's build ``plan``: that build (not the one a call's shape would pick)
    against Triton's forward, on keys ending part-way through a key tile where the build masks them, else on
    whole tiles."""
    key_counts = partial_tiles(plan.tile_n) if plan.mask_keys else whole_tiles(plan.tile_n)

    def cases():
        return random_cases(plan, device, tuple(shape[3] for shape in CHECK_SHAPES), key_counts, grad=False)

    def candidate(q, k, v, activation, scale, post_scale, slope):
        from ..kernels.cute import gdpa_fwd

        return gdpa_fwd.gdpa_fwd_cute_sm100(q, k, v, activation, scale, post_scale, slope, plan=plan)

    def trusted(q, k, v, activation, scale, post_scale, slope):
        from ..kernels.triton import gdpa_fwd

        return gdpa_fwd.gdpa_fwd_triton(q, k, v, None, activation, scale, post_scale, False, slope)

    def exact(q, k, v, activation, scale, post_scale, slope):
        from ..kernels.reference import gdpa_reference

        return gdpa_reference(q, k, v, None, activation, scale, post_scale, False, slope)

    mask = "keys masked past Nk" if plan.mask_keys else "whole key tiles"
    name = sm100_kernels.variant("forward", plan, f"{plan.tile_n}-key tiles", mask)
    return self_check.Check(name, candidate, trusted, exact, cases)
