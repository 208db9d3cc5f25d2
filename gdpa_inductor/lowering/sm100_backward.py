"""Which dense backward calls (with or without the causal mask) the CuTe Blackwell backward (``GdpaBwdSm100``) takes
on an sm_100 GPU, the way the
forward is taken (``sm100_forward``, the shared glue in ``sm100_kernels``): those ``sm100_bwd_supported`` covers,
once the build the call would run has passed its first-use self-check against Triton's backward on the device
(``self_check``: dq, dk and dv each). No Blackwell GPU has run the kernel in this project's tests, so no build serves
a call unchecked."""

from __future__ import annotations

import torch

from ..kernels.activations import ActivationName
from . import self_check, sm100_kernels
from .sm100_kernels import CHECK_SHAPES, partial_tiles, random_cases, whole_tiles

# the check's post_scale: a value other than 1, as dS, dV and the host's scaling of dQ each multiply by it
CHECK_POST_SCALE = 0.5


def sm100_backward_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                           activation: ActivationName, bias_grad: bool = False,
                           dout: torch.Tensor | None = None) -> tuple[bool, str]:
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting) and the output's gradient
    ``dout`` (None: one of the output's shape and q's dtype, as autograd hands it): ``sm100_bwd_supported`` on their
    4-D views, then the self-check's verdict on the call's build."""
    from ..kernels.cute.bwd_support import sm100_bwd_supported
    from ..kernels.cute.gdpa_bwd import plan_dense_bwd_sm100
    from ..kernels.cute.gdpa_fwd import sm100_bias_name
    from ..kernels.cute.operand_views import bias_4d

    if dout is None and min(q.dim(), k.dim(), v.dim()) >= 3:
        shape = (*torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]), *q.shape[-3:-1], v.shape[-1])
        dout = torch.empty(shape, dtype=q.dtype, device="meta")
    views = sm100_kernels.dense_views(q, k, v, *(() if dout is None else (dout,)))
    if views is None:
        return sm100_kernels.NOT_DENSE
    (q4, k4, v4, do4), batch = views
    bias4 = bias_4d(bias, batch, q4.shape[2])
    covered = sm100_bwd_supported(q4, k4, v4, do4, bias4, causal, activation, bias_grad)
    return sm100_kernels.checked_support(
        "backward", covered,
        lambda: plan_dense_bwd_sm100(q4, activation, causal, False, sm100_bias_name(bias4), bias_grad),
        backward_check, q.device)


def may_take(q: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName) -> bool:
    """Whether the opaque op could run this backward on the Blackwell kernel (``sm100_kernels.may_take``, with its
    causal mask and bias; the graph may not know Nq's remainder nor whether the bias's gradient is wanted, so a
    build of either query mask, with or without the gradient, failing sends the call to Triton)."""
    from ..kernels.cute.bwd_plan import SM100_BWD_HEAD_DIMS, plan_bwd_sm100
    from ..kernels.cute.gdpa_fwd import sm100_bias_name
    from .sm100_forward import bias_dtype_taken

    if not bias_dtype_taken(q, bias):
        return False
    name = sm100_bias_name(bias)
    grads = (False, True) if name and bias.numel() != 1 else (False,)
    return all(sm100_kernels.may_take(
        "backward", q, v, bias, causal, activation, SM100_BWD_HEAD_DIMS,
        lambda masked, grad=grad: plan_bwd_sm100(q.dtype, q.shape[-1], activation, mask_queries=masked, causal=causal,
                                                 bias=name, bias_grad=grad), masks=True) for grad in grads)


def backward_check(plan, device: torch.device) -> self_check.Check:
    """The self-check of the Blackwell backward's build ``plan``: that build's (dq, dk, dv, and dbias where it writes
    one) against Triton's backward, on keys ending part-way through a key tile, and queries ending part-way through
    a query tile where the build masks them, else whole query tiles; a causal build under its mask, at Nq below and
    above Nk; a bias build with a random [1, H, Nq, Nk] bias of its element type. The kernel runs on
    ``sm100_kernels.CHECK_CTAS`` CTAs, each walking several tiles."""
    from ..kernels.cute.bwd_plan import SM100_BWD_TILE

    query_counts = tuple(shape[3] for shape in CHECK_SHAPES) if plan.mask_queries else whole_tiles(SM100_BWD_TILE)
    bias_dtype = getattr(torch, plan.bias) if plan.bias else None

    def cases():
        gen = torch.Generator(device=device).manual_seed(7)
        for dout, q, k, v, *params in random_cases(plan, device, query_counts, partial_tiles(SM100_BWD_TILE),
                                                   grad=True, post_scale=CHECK_POST_SCALE):
            bias = None
            if bias_dtype is not None:
                bias = torch.randn(1, q.shape[1], q.shape[2], k.shape[2], generator=gen, device=device,
                                   dtype=bias_dtype)
            yield dout, q, k, v, bias, *params

    def candidate(dout, q, k, v, bias, activation, scale, post_scale, slope):
        from ..kernels.cute import gdpa_bwd

        grads = gdpa_bwd.gdpa_bwd_cute_sm100(q, k, v, dout, activation, scale, post_scale, slope, plan=plan,
                                             causal=plan.causal, bias=bias, bias_grad=plan.bias_grad,
                                             ctas=sm100_kernels.CHECK_CTAS)
        return grads if plan.bias_grad else grads[:3]

    def trusted(dout, q, k, v, bias, activation, scale, post_scale, slope):
        from ..kernels.triton import gdpa_bwd

        grads = gdpa_bwd.gdpa_bwd_triton(dout, q, k, v, bias, activation, scale, post_scale, plan.causal, slope,
                                         plan.bias_grad)
        return grads if plan.bias_grad else grads[:3]

    def exact(dout, q, k, v, bias, activation, scale, post_scale, slope):
        from ..kernels.reference import gdpa_reference_backward

        grads = gdpa_reference_backward(dout, q, k, v, bias, activation, scale, post_scale, plan.causal, slope,
                                        plan.bias_grad)
        return grads if plan.bias_grad else grads[:3]

    mask = "queries masked past Nq" if plan.mask_queries else "whole query tiles"
    extra = (("causal",) if plan.causal else ()) + ((f"{plan.bias} bias",) if plan.bias else ()) + (
        ("its gradient",) if plan.bias_grad else ())
    name = sm100_kernels.variant("backward", plan, f"{plan.q_stages} Q/dO stages", mask, *extra)
    outputs = ("dq", "dk", "dv", "dbias") if plan.bias_grad else ("dq", "dk", "dv")
    return self_check.Check(name, candidate, trusted, exact, cases, outputs=outputs)
