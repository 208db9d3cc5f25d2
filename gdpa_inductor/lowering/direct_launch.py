"""The fused ops in the form a compiled graph launches itself.

The backend's rewrite emits ``gdpa::attention_fwd_direct_v1`` and ``gdpa::varlen_fwd_direct_v4`` (with their
backward ops): ``torch.library.triton_op``s, so when Inductor compiles the graph it traces their bodies, and where a
body launches Triton kernels through ``torch.library.wrap_triton`` the compiled code launches them as it launches
its own kernels. No Python of this package then runs per call: a fused call costs the host its launches, not the
op's dispatch, support checks and launcher (``benchmarks/host.py overhead``).

That path is taken where every choice the op makes can be made when the graph compiles: CUDA tensors of static
shapes, Triton chosen, and no gradient added by atomics into a broadcast input's shared buffer (tracing would copy
that buffer). Where the machine has the CuTe kernels (sm_90; on sm_100 the Blackwell forward, dense or varlen, and
the dense backward), a call they may take goes through the opaque op when the GPU time they save (estimated from the
call's FLOPs) outweighs that op's host time, or under CUDA graphs; smaller calls are launched by the graph on Triton.
Every other call is one call of the opaque op (``ops.py``, ``varlen_ops.py``) that chooses, and falls back, per call. If
Inductor cannot compile the direct launches, the backend compiles the graph again with this path off (``disabled``).

The direct ops are registered by ``register()``, which the rewrite calls: registering a triton_op imports Triton and
Inductor's utilities, which a plain ``import gdpa_inductor`` (an eager call, the reference) does not need.
"""

from __future__ import annotations

import contextlib
import logging
import math

import torch

from .. import config
from ..kernels.triton.layout import interpreting
from .dispatch import triton_support
from .op_autograd import OpAutograd

log = logging.getLogger("gdpa_inductor")
_disabled = False


@contextlib.contextmanager
def disabled():
    """Within: every call takes the opaque op."""
    global _disabled
    saved, _disabled = _disabled, True
    try:
        yield
    finally:
        _disabled = saved


def _static(*tensors: torch.Tensor | None) -> bool:
    return all(isinstance(n, int) for t in tensors if t is not None for n in (*t.shape, *t.stride()))


# A call of the opaque op (the one path to the CuTe kernels) costs the host about this much per call, a launch
# from the graph a few tens of us (benchmarks/host.py overhead, H200: 175-590 us per opaque call).
OPAQUE_CALL_HOST_S = 400e-6
# The Triton kernels' rate at Meta's shapes (TF/s) and the share of their time the CuTe kernels save
# (docs/benchmarks.md, every provider in one run, H100): forward ~400 and 25%, backward ~250 and 45%.
TRITON_RATE = {"forward": 400e12, "backward": 250e12}
CUTE_SAVES = {"forward": 0.25, "backward": 0.45}


def forward_flops(query_rows: int, key_span: int, d: int, dv: int, causal: bool) -> float:
    """The forward's matmul FLOPs: ``query_rows`` rows (every head and sample) against ``key_span`` keys each (about
    half where causal)."""
    keys = (key_span + 1) / 2 if causal else key_span
    return 2.0 * query_rows * keys * (d + dv)


def dense_flops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> float:
    """``forward_flops`` of the dense op on [..., H, N, D] operands (a broadcast batch counted whole)."""
    batch = math.prod(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3]))
    return forward_flops(batch * q.shape[-3] * q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], causal)


def varlen_flops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor | None,
                 cu_seqlens_k: torch.Tensor | None, max_seqlen_k: int, causal: bool, window: tuple[int, int]) -> float:
    """``forward_flops`` of the varlen op: q and k each jagged [total, H, D] (with cu_seqlens) or padded [B, N, H, D]
    (a padded q of batch 1 broadcast over the samples), every sample taken at its longest."""
    keys = max_seqlen_k if cu_seqlens_k is not None else k.shape[-3]
    left, right = window
    if left >= 0 and right >= 0:
        keys, causal = min(keys, left + right + 1), False
    if cu_seqlens_q is not None:
        rows = q.shape[0] * q.shape[1]
    else:
        samples = cu_seqlens_k.shape[0] - 1 if cu_seqlens_k is not None else k.shape[0]
        rows = max(q.shape[0], samples) * q.shape[1] * q.shape[2]
    return forward_flops(rows, keys, q.shape[-1], v.shape[-1], causal)


def cute_worth_opaque_call(flops: float, backward: bool) -> tuple[bool, str]:
    """(worth, reason): whether the GPU time the CuTe kernels save on a call of this work outweighs the host time
    of the opaque call that runs them. Under CUDA graphs (mode="reduce-overhead") the host time is not paid per step."""
    from torch._inductor import config as inductor_config

    if inductor_config.triton.cudagraphs:
        return True, "under CUDA graphs the opaque call's host time is not paid per step"
    name = "backward" if backward else "forward"
    factor = 2.5 if backward else 1.0
    saved = factor * flops / TRITON_RATE[name] * CUTE_SAVES[name]
    if saved > OPAQUE_CALL_HOST_S:
        return True, f"the CuTe {name} saves ~{saved * 1e6:.0f} us of GPU time, more than the opaque call's host time"
    return False, f"the CuTe {name} would save ~{saved * 1e6:.0f} us of GPU time, less than the opaque call's host time"


def triton_direct(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                  *others: torch.Tensor | None, flops: float, backward: bool,
                  dense: tuple[bool, str] | None = None, varlen: tuple | None = None) -> bool:
    """Whether this call launches the Triton kernels from the compiled graph (``others``: its other tensors;
    ``flops``: its forward's, ``forward_flops``; ``dense``: the (causal, activation) of a dense call, ``varlen``: the
    (causal, window, activation) of a varlen call, the calls sm_100's CuTe kernels may take)."""
    if _disabled or q.device.type != "cuda" or interpreting() or config.backend not in ("auto", "triton"):
        return False
    if not _static(q, k, v, bias, *others):
        return False
    if config.backend == "auto":
        if cute_machine(q, v, bias, dense, backward, varlen):
            worth, why = cute_worth_opaque_call(flops, backward)
            log.debug("gdpa: %s", why)
            if worth:
                return False
    ok = triton_support(q, k, v, bias)[0]
    if ok:
        log.debug("gdpa: the compiled graph launches this call's Triton kernels itself (%s)",
                  ", ".join(str(tuple(t.shape)) for t in (q, k, v)))
    return ok


def cute_machine(q: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, dense: tuple[bool, str] | None,
                 backward: bool = False, varlen: tuple | None = None) -> bool:
    """Whether the opaque op may run this call on CuTe: on sm_90 any call (the op checks the rest), on sm_100 a dense
    forward or backward (``dense``: its (causal, activation); ``backward``: which) or a varlen one (``varlen``: its
    (causal, window, activation)) the Blackwell kernels may take (``sm100_forward.may_take``,
    ``sm100_backward.may_take``, ``sm100_varlen_forward.may_take``, ``sm100_varlen_backward.may_take``; the estimate
    of the time saved is Hopper's, as nothing has been measured there)."""
    from ..kernels.cute.fwd_support import machine_support

    if machine_support(q.device)[0]:
        return True
    if varlen is not None:
        from . import sm100_varlen_backward, sm100_varlen_forward

        return (sm100_varlen_backward if backward else sm100_varlen_forward).may_take(q, v, bias, *varlen)
    if dense is None:
        return False
    from . import sm100_backward, sm100_forward

    return (sm100_backward if backward else sm100_forward).may_take(q, v, bias, *dense)


_registered = False


def register() -> None:
    """Registers the direct ops (``torch.ops.gdpa.*_direct_*``) once per process."""
    global _registered
    if _registered:
        return
    from . import ops, varlen_ops

    @torch.library.triton_op("gdpa::attention_fwd_direct_v1", mutates_args=())
    def attention_fwd_direct(
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
        args = (q, k, v, bias, activation, scale, post_scale, causal, negative_slope)
        if triton_direct(q, k, v, bias, flops=dense_flops(q, k, v, causal), backward=False,
                         dense=(causal, activation)):
            from ..kernels.triton.gdpa_fwd import gdpa_fwd_triton

            return gdpa_fwd_triton(*args, traced=True)
        return ops.attention_fwd(*args)

    @torch.library.triton_op("gdpa::attention_bwd_direct_v1", mutates_args=())
    def attention_bwd_direct(
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
        args = (dout, q, k, v, bias, activation, scale, post_scale, causal, negative_slope, bias_requires_grad)
        if triton_direct(q, k, v, bias, dout, flops=dense_flops(q, k, v, causal), backward=True,
                         dense=(causal, activation)):
            from ..kernels.triton.gdpa_bwd import gdpa_bwd_triton
            from ..kernels.triton.layout import atomic_grads

            if not atomic_grads(q, k, v, bias, bias_requires_grad):
                dq, dk, dv, dbias = gdpa_bwd_triton(*args, traced=True)
                return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)
        return ops.attention_bwd(*args)

    OpAutograd(4, attention_bwd_direct).register(attention_fwd_direct)

    @torch.library.triton_op("gdpa::varlen_fwd_direct_v4", mutates_args=())
    def varlen_fwd_direct(
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
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
        if _varlen_direct(q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, causal, (window_left, window_right),
                          activation, False):
            params = (activation, scale, post_scale, causal, (window_left, window_right), negative_slope)
            scheduled = varlen_ops.sides(q, k, *rows, max_seqlen_q, max_seqlen_k, True)
            out = varlen_ops._forward_on("triton", True, q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, params,
                                         scheduled=scheduled)
            return out, scheduled[3]
        out = varlen_ops.varlen_fwd(q, k, v, bias, *rows, max_seqlen_q, max_seqlen_k, activation, scale, post_scale,
                                    causal, window_left, window_right, negative_slope)
        return out, q.new_empty(0, dtype=torch.int32)

    @torch.library.triton_op("gdpa::varlen_bwd_direct_v4", mutates_args=())
    def varlen_bwd_direct(
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        cu_seqlens_q: torch.Tensor | None,
        cu_seqlens_k: torch.Tensor | None,
        seqused_q: torch.Tensor | None,
        seqused_k: torch.Tensor | None,
        schedule: torch.Tensor,
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
        rows = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
        if _varlen_direct(q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, causal, (window_left, window_right),
                          activation, True, dout):
            from ..kernels.triton.varlen_schedule import scheduled_sides

            params = (activation, scale, post_scale, causal, (window_left, window_right), negative_slope)
            batch = varlen_ops.varlen_batch(q, k, cu_seqlens_q, cu_seqlens_k)
            scheduled = None
            if schedule.numel() > 0:  # the forward's schedule, where the forward launched from the graph too
                scheduled = (batch, *scheduled_sides(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                     batch, schedule), schedule)
            dq, dk, dv, dbias = varlen_ops._backward_on("triton", True, dout, q, k, v, bias, rows, max_seqlen_q,
                                                        max_seqlen_k, params, bias_requires_grad, scheduled=scheduled)
            return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)
        return varlen_ops.varlen_bwd(dout, q, k, v, bias, *rows, max_seqlen_q, max_seqlen_k, activation, scale,
                                     post_scale, causal, window_left, window_right, negative_slope, bias_requires_grad)

    ScheduledVarlenAutograd(varlen_bwd_direct).register(varlen_fwd_direct)
    _registered = True


class ScheduledVarlenAutograd(OpAutograd):
    """The varlen direct ops' autograd: as the varlen op's, and the forward's schedule (its second output) goes to
    the backward, which then need not make it again."""

    def __init__(self, backward):
        super().__init__(8, backward)

    def setup_context(self, ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[:self.saved], *output[1:])
        ctx.params = tuple(inputs[self.saved:])

    def backward(self, ctx, dout, schedule_grad) -> tuple:
        *saved, schedule = ctx.saved_tensors
        bias_grad = saved[3] is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = self.backward_fn(dout, *saved, schedule, *ctx.params, bias_grad)
        return (dq, dk, dv, dbias if bias_grad else None) + (None,) * (len(saved) - 4 + len(ctx.params))


def _varlen_direct(q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, causal, window, activation, backward,
                   *others) -> bool:
    if not (isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)):
        return False
    flops = varlen_flops(q, k, v, rows[0], rows[1], max_seqlen_k, causal, window)
    return triton_direct(q, k, v, bias, *rows, *others, flops=flops, backward=backward,
                         varlen=(causal, window, activation))
