"""The fused ops in the form a compiled graph launches itself.

The backend's rewrite emits ``gdpa::attention_fwd_direct_v1`` and ``gdpa::varlen_fwd_direct_v2`` (with their
backward ops): ``torch.library.triton_op``s, so when Inductor compiles the graph it traces their bodies, and where a
body launches Triton kernels through ``torch.library.wrap_triton`` the compiled code launches them as it launches
its own kernels. No Python of this package then runs per call: a fused call costs the host its launches, not the
op's dispatch, support checks and launcher (``benchmarks/host_overhead.py``).

That path is taken where every choice the op makes can be made when the graph compiles: CUDA tensors of static
shapes, Triton chosen (the CuTe kernels, where the machine has them, are chosen per call), and no gradient added
by atomics into a broadcast input's shared buffer (tracing would copy that buffer). Every other call is one call of
the opaque op (``ops.py``, ``varlen_ops.py``) that chooses, and falls back, per call. If Inductor cannot compile the
direct launches, the backend compiles the graph again with this path off (``disabled``).

The direct ops are registered by ``register()``, which the rewrite calls: registering a triton_op imports Triton and
Inductor's utilities, which a plain ``import gdpa_inductor`` (an eager call, the reference) does not need.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from .. import config
from ..kernels.triton.layout import interpreting
from .dispatch import triton_support

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


def triton_direct(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                  *others: torch.Tensor | None) -> bool:
    """Whether this call launches the Triton kernels from the compiled graph (``others``: its other tensors)."""
    if _disabled or q.device.type != "cuda" or interpreting() or config.backend not in ("auto", "triton"):
        return False
    if not _static(q, k, v, bias, *others):
        return False
    if config.backend == "auto":
        from ..kernels.cute.gdpa_fwd import machine_support

        if machine_support(q.device)[0]:
            return False
    ok = triton_support(q, k, v, bias)[0]
    if ok:
        log.debug("gdpa: the compiled graph launches this call's Triton kernels itself (%s)",
                  ", ".join(str(tuple(t.shape)) for t in (q, k, v)))
    return ok


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
        if triton_direct(q, k, v, bias):
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
        if triton_direct(q, k, v, bias, dout):
            from ..kernels.triton.gdpa_bwd import atomic_grads, gdpa_bwd_triton

            if not atomic_grads(q, k, v, bias, bias_requires_grad):
                dq, dk, dv, dbias = gdpa_bwd_triton(*args, traced=True)
                return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)
        return ops.attention_bwd(*args)

    def attention_backward(ctx, dout):
        q, k, v, bias = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = attention_bwd_direct(dout, q, k, v, bias, *ctx.params, bias_grad)
        return dq, dk, dv, dbias if bias_grad else None, None, None, None, None, None

    attention_fwd_direct.register_autograd(attention_backward, setup_context=ops._setup_context)

    @torch.library.triton_op("gdpa::varlen_fwd_direct_v2", mutates_args=())
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
    ) -> torch.Tensor:
        rows = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
        if _varlen_direct(q, k, v, bias, rows, max_seqlen_q, max_seqlen_k):
            params = (activation, scale, post_scale, causal, (window_left, window_right), negative_slope)
            return varlen_ops._forward_on("triton", True, q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, params)
        return varlen_ops.varlen_fwd(q, k, v, bias, *rows, max_seqlen_q, max_seqlen_k, activation, scale, post_scale,
                                     causal, window_left, window_right, negative_slope)

    @torch.library.triton_op("gdpa::varlen_bwd_direct_v2", mutates_args=())
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
        if _varlen_direct(q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, dout):
            params = (activation, scale, post_scale, causal, (window_left, window_right), negative_slope)
            dq, dk, dv, dbias = varlen_ops._backward_on("triton", True, dout, q, k, v, bias, rows, max_seqlen_q,
                                                        max_seqlen_k, params, bias_requires_grad)
            return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)
        return varlen_ops.varlen_bwd(dout, q, k, v, bias, *rows, max_seqlen_q, max_seqlen_k, activation, scale,
                                     post_scale, causal, window_left, window_right, negative_slope, bias_requires_grad)

    def varlen_backward(ctx, dout):
        q, k, v, bias, cu_q, cu_k, used_q, used_k = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dbias = varlen_bwd_direct(dout, q, k, v, bias, cu_q, cu_k, used_q, used_k, *ctx.params, bias_grad)
        return (dq, dk, dv, dbias if bias_grad else None) + (None,) * 13

    varlen_fwd_direct.register_autograd(varlen_backward, setup_context=varlen_ops._setup_context)
    _registered = True


def _varlen_direct(q, k, v, bias, rows, max_seqlen_q, max_seqlen_k, *others) -> bool:
    return (isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)
            and triton_direct(q, k, v, bias, *rows, *others))
