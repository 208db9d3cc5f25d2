"""The varlen GDPA custom ops, their fakes and their autograd.

- ``gdpa::varlen_fwd_v2(q, k, v, bias?, cu_seqlens_q?, cu_seqlens_k?, seqused_q?, seqused_k?, max_seqlen_q,
  max_seqlen_k, activation, scale, post_scale, causal, window_left, window_right, negative_slope) -> out``
- ``gdpa::varlen_bwd_v2(dout, <the same>, bias_requires_grad) -> (dq, dk, dv, dbias)``

Layouts and the bias's indexing are described in ``kernels/reference_varlen.py``; a window side of -1 is
unbounded. dbias is an empty tensor when no bias gradient is asked for. The autograd saves the inputs and the
offsets only. ``direct_launch.py`` adds the forms of these ops whose Triton launches a compiled graph makes itself.
"""

from __future__ import annotations

import torch

from ..kernels.reference_varlen import (
    gdpa_varlen_reference,
    gdpa_varlen_reference_backward,
    varlen_batch,
    varlen_out_shape,
)
from . import fallback
from .dispatch import select_varlen_backward_impl, select_varlen_forward_impl
from .op_autograd import OpAutograd


def sides(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, traced):
    """(batch, query side, key side, schedule): the schedule of a call's samples (``varlen_sides``), made in one
    launch."""
    from ..kernels.triton.varlen_schedule import varlen_sides

    batch = varlen_batch(q, k, cu_seqlens_q, cu_seqlens_k)
    return batch, *varlen_sides(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                max_seqlen_k, batch, traced)


def _forward_on(impl, traced, q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, params, plan=None,
                ctas=None, scheduled=None) -> torch.Tensor:
    """The forward on ``impl`` ("cute": on sm_100 the Blackwell forward, its build ``plan`` and grid ``ctas`` where
    given); ``traced``: its Triton launches go into a compiled graph; ``scheduled``: ``sides``' result, where made."""
    if impl == "reference":
        return gdpa_varlen_reference(q, k, v, bias, *rows, max_seqlen_q, max_seqlen_k, *params)
    from ..kernels.common.varlen_rows import with_tensor

    batch, qs, ks, schedule = scheduled or sides(q, k, *rows, max_seqlen_q, max_seqlen_k, traced)
    # Every row of a jagged or full dense query is written; a padded one leaves zeros past its lengths.
    alloc = torch.zeros if rows[2] is not None else torch.empty
    out = alloc(varlen_out_shape(q, v, rows[0], batch), dtype=v.dtype, device=v.device)
    activation, scale, post_scale, causal, window, negative_slope = params
    if impl == "cute":
        from ..kernels.cute.fwd_support import on_sm100

        if plan is not None or on_sm100(q.device):
            from ..kernels.cute.varlen_fwd import gdpa_varlen_fwd_cute_sm100, plan_varlen_fwd_sm100

            # the build the dispatch's self-check passed, named here as the dense op's launcher names its own
            plan = plan or plan_varlen_fwd_sm100(q.dtype, q.shape[-1], activation, causal, window, bias)
            return gdpa_varlen_fwd_cute_sm100(qs, ks, v, with_tensor(qs, out), _order(schedule), activation, scale,
                                              post_scale, negative_slope, causal, window, bias, plan=plan, ctas=ctas)
        from ..kernels.cute.varlen_fwd import gdpa_varlen_fwd_cute
        from ..kernels.cute.varlen_plan import varlen_band

        return gdpa_varlen_fwd_cute(qs, ks, v, with_tensor(qs, out), _order(schedule), activation, scale,
                                    post_scale, negative_slope, causal, varlen_band(q, k, v, causal, window, rows),
                                    bias)
    from ..kernels.triton.varlen_fwd import gdpa_varlen_fwd_triton

    gdpa_varlen_fwd_triton(qs, ks, v, bias, with_tensor(qs, out), schedule, *params, traced=traced)
    return out


def _backward_on(impl, traced, dout, q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, params, bias_requires_grad,
                 plan=None, ctas=None, scheduled=None):
    """(dq, dk, dv, dbias or None) on ``impl`` ("cute": on sm_100 the Blackwell backward, its build ``plan`` and grid
    ``ctas`` where given); ``traced`` and ``scheduled`` as for ``_forward_on``."""
    if impl == "reference":
        return gdpa_varlen_reference_backward(dout, q, k, v, bias, *rows, max_seqlen_q, max_seqlen_k, *params,
                                              bias_requires_grad)
    _, qs, ks, schedule = scheduled or sides(q, k, *rows, max_seqlen_q, max_seqlen_k, traced)
    activation, scale, post_scale, causal, window, negative_slope = params
    if impl == "cute":
        from ..kernels.cute.fwd_support import on_sm100

        if plan is not None or on_sm100(q.device):
            from ..kernels.cute.varlen_bwd import gdpa_varlen_bwd_cute_sm100, plan_varlen_bwd_sm100

            # the build the dispatch's self-check passed, named as the forward's is
            plan = plan or plan_varlen_bwd_sm100(q.dtype, q.shape[-1], activation, causal, window, bias,
                                                 bias_requires_grad)
            return gdpa_varlen_bwd_cute_sm100(dout, qs, ks, v, _order(schedule), activation, scale, post_scale,
                                              negative_slope, causal, window, bias, bias_requires_grad, plan=plan,
                                              ctas=ctas)
        from ..kernels.cute.varlen_bwd import gdpa_varlen_bwd_cute
        from ..kernels.cute.varlen_plan import varlen_band

        return gdpa_varlen_bwd_cute(dout, qs, ks, v, _order(schedule), activation, scale, post_scale,
                                    negative_slope, causal, varlen_band(q, k, v, causal, window, rows), bias,
                                    bias_requires_grad)
    from ..kernels.common.varlen_rows import with_tensor
    from ..kernels.triton.varlen_bwd import gdpa_varlen_bwd_triton

    return gdpa_varlen_bwd_triton(with_tensor(qs, dout), qs, ks, v, bias, schedule, *params, bias_requires_grad,
                                  traced=traced)


def _order(schedule: torch.Tensor) -> torch.Tensor:
    from ..kernels.triton.varlen_schedule import ORDER, row

    return row(schedule, ORDER)


def forward_impl(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                 activation, scale, post_scale, causal, window_left, window_right, negative_slope) -> torch.Tensor:
    """The forward on the chosen kernel (what the op runs; the eager fast path calls it directly)."""
    rows = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    window = (window_left, window_right)
    params = (activation, scale, post_scale, causal, window, negative_slope)

    def run_path(impl):
        return _forward_on(impl, False, q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, params)

    impl = select_varlen_forward_impl(q, k, v, bias, causal, window, activation, rows)
    kind = fallback.call_kind("varlen forward", q, v, bias, activation, causal, window, _row_kinds(rows))
    return fallback.run(impl, kind, run_path, (q, k, v, bias))


def backward_impl(dout, q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                  activation, scale, post_scale, causal, window_left, window_right, negative_slope,
                  bias_requires_grad):
    """(dq, dk, dv, dbias or None) on the chosen kernel."""
    rows = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    window = (window_left, window_right)
    params = (activation, scale, post_scale, causal, window, negative_slope)

    def run_path(impl):
        return _backward_on(impl, False, dout, q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, params,
                            bias_requires_grad)

    impl = select_varlen_backward_impl(q, k, v, bias, causal, window, activation, rows, bias_requires_grad)
    kind = fallback.call_kind("varlen backward", q, v, bias, activation, causal, window, _row_kinds(rows),
                              bias_requires_grad)
    return fallback.run(impl, kind, run_path, (q, k, v, bias))


def _row_kinds(rows: tuple) -> tuple[bool, ...]:
    """Which of (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k) the call gives: they pick the kernel variant."""
    return tuple(r is not None for r in rows)


@torch.library.custom_op("gdpa::varlen_fwd_v2", mutates_args=())
def varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    activation: str,
    scale: float,
    post_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    negative_slope: float,
) -> torch.Tensor:
    return forward_impl(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                        activation, scale, post_scale, causal, window_left, window_right, negative_slope)


@varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, *args):
    return v.new_empty(varlen_out_shape(q, v, cu_seqlens_q, varlen_batch(q, k, cu_seqlens_q, cu_seqlens_k)))


@torch.library.custom_op("gdpa::varlen_bwd_v2", mutates_args=())
def varlen_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    activation: str,
    scale: float,
    post_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    negative_slope: float,
    bias_requires_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dbias = backward_impl(dout, q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                                      max_seqlen_q, max_seqlen_k, activation, scale, post_scale, causal, window_left,
                                      window_right, negative_slope, bias_requires_grad)
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)

@varlen_bwd.register_fake
def _varlen_bwd_fake(dout, q, k, v, bias, *args):
    bias_requires_grad = args[-1]
    dbias = bias.new_empty(bias.shape) if bias is not None and bias_requires_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


# q, k, v, bias and the four row tensors saved
OpAutograd(8, varlen_bwd).register(varlen_fwd)
# the eager fast path's autograd: the implementation, looked up when the backward runs
EAGER_AUTOGRAD = OpAutograd(8, lambda *args: backward_impl(*args))
