"""The GDPA custom ops (namespace ``gdpa``), their fake implementations and their autograd.

- ``gdpa::attention_fwd_v1(q, k, v, bias?, activation, scale, post_scale, causal, negative_slope) -> out``
- ``gdpa::attention_bwd_v1(dout, q, k, v, bias?, ..., bias_requires_grad) -> (dq, dk, dv, dbias)``

The version is part of the name so that compiled artifacts cached against an older signature or
semantics go stale instead of being replayed. The autograd saves only the inputs (S is recomputed).
dbias is an empty tensor when no bias gradient is asked for (custom ops cannot return None).
Every output is a fresh contiguous tensor; the fakes say exactly that.
"""

from __future__ import annotations

import torch

from ..kernels.reference import gdpa_reference, gdpa_reference_backward
from . import fallback
from .dispatch import select_backward_impl, select_forward_impl
from .op_autograd import OpAutograd


def _broadcast_batch(q, k, v) -> tuple:
    return tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))


def forward_impl(q, k, v, bias, activation, scale, post_scale, causal, negative_slope) -> torch.Tensor:
    """The forward on the chosen kernel (what the op runs; the eager fast path calls it directly)."""
    args = (q, k, v, bias, activation, scale, post_scale, causal, negative_slope)

    def run_path(impl):
        if impl == "cute":
            from ..kernels.cute.fwd_support import on_sm100

            if on_sm100(q.device):
                from ..kernels.cute.gdpa_fwd import gdpa_fwd_cute_sm100_op

                return gdpa_fwd_cute_sm100_op(q, k, v, activation, scale, post_scale, negative_slope, causal, bias)
            from ..kernels.cute.gdpa_fwd import gdpa_fwd_cute_op

            return gdpa_fwd_cute_op(q, k, v, activation, scale, post_scale, negative_slope, causal, bias)
        if impl == "triton":
            from ..kernels.triton.gdpa_fwd import gdpa_fwd_triton

            return gdpa_fwd_triton(*args)
        return gdpa_reference(*args)

    impl = select_forward_impl(q, k, v, bias, causal, activation)
    kind = fallback.call_kind("forward", q, v, bias, activation, causal)
    return fallback.run(impl, kind, run_path, (q, k, v, bias))


def backward_impl(dout, q, k, v, bias, activation, scale, post_scale, causal, negative_slope, bias_requires_grad):
    """(dq, dk, dv, dbias or None) on the chosen kernel."""
    args = (dout, q, k, v, bias, activation, scale, post_scale, causal, negative_slope, bias_requires_grad)

    def run_path(impl):
        if impl == "cute":
            from ..kernels.cute.fwd_support import on_sm100

            if on_sm100(q.device):
                from ..kernels.cute.gdpa_bwd import gdpa_bwd_cute_sm100_op

                return gdpa_bwd_cute_sm100_op(dout, q, k, v, activation, scale, post_scale, negative_slope, causal,
                                              bias, bias_requires_grad)
            from ..kernels.cute.gdpa_bwd import gdpa_bwd_cute_op

            return gdpa_bwd_cute_op(dout, q, k, v, activation, scale, post_scale, negative_slope, causal, bias,
                                         bias_requires_grad)
        if impl == "triton":
            from ..kernels.triton.gdpa_bwd import gdpa_bwd_triton

            return gdpa_bwd_triton(*args)
        return gdpa_reference_backward(*args)

    impl = select_backward_impl(q, k, v, bias, causal, activation, bias_requires_grad, dout)
    kind = fallback.call_kind("backward", q, v, bias, activation, causal, bias_requires_grad)
    return fallback.run(impl, kind, run_path, (q, k, v, bias))


@torch.library.custom_op("gdpa::attention_fwd_v1", mutates_args=())
def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    scale: float,
    post_scale: float,
    causal: bool,
    negative_slope: float,
) -> torch.Tensor:
    return forward_impl(q, k, v, bias, activation, scale, post_scale, causal, negative_slope)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, bias, activation, scale, post_scale, causal, negative_slope):
    return v.new_empty((*_broadcast_batch(q, k, v), q.shape[-3], q.shape[-2], v.shape[-1]))


@torch.library.custom_op("gdpa::attention_bwd_v1", mutates_args=())
def attention_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str,
    scale: float,
    post_scale: float,
    causal: bool,
    negative_slope: float,
    bias_requires_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dbias = backward_impl(dout, q, k, v, bias, activation, scale, post_scale, causal, negative_slope,
                                      bias_requires_grad)
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, bias, activation, scale, post_scale, causal, negative_slope, bias_requires_grad):
    dbias = bias.new_empty(bias.shape) if bias is not None and bias_requires_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


OpAutograd(4, attention_bwd).register(attention_fwd)
# the eager fast path's autograd (``eager``): the same steps on the implementation, looked up when the backward runs
EAGER_AUTOGRAD = OpAutograd(4, lambda *args: backward_impl(*args))
