"""The eager fast path: the custom ops' kernels behind one ``torch.autograd.Function``, for plain tensors.

A Python custom op pays for its generality on every eager call: the autograd wrapper refills the schema's
defaults, the backend wrapper checks aliasing, and the dispatcher goes through Python twice. On an H200
(torch 2.11) that was 0.32 ms of host time per varlen call with autograd (0.58 ms with validation and the
launches) against 0.30 ms of GPU time at Meta's shortest jagged shape, so short calls were host-bound
(``benchmarks/host.py overhead``). When nothing traces the call (no torch.compile or export, no fake or
functional tensors, no dispatch mode, no functorch transform) the public functions run the same
implementations through this path instead; anything that traces still sees the custom ops, so the
compiled graphs, opcheck and the fakes are unchanged. Both paths run ``forward_impl``/``backward_impl``, and one
autograd (``op_autograd``) serves both ops on both paths.
"""

from __future__ import annotations

import torch

from . import ops, varlen_ops
from .op_autograd import EagerAttention

_EAGER_DEVICES = ("cuda", "cpu")
# Exact types: any other Tensor subclass may override dispatch, so it keeps the custom op.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def plain_eager(*tensors: torch.Tensor | None) -> bool:
    """True when this call runs eagerly on plain tensors, with nothing that would trace it."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    return all(t is None or (type(t) in _PLAIN_TYPES and t.device.type in _EAGER_DEVICES) for t in tensors)


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def attention(q, k, v, bias, activation, scale, post_scale, causal, negative_slope) -> torch.Tensor:
    """``gdpa::attention_fwd_v1`` with its autograd, through the fast path where nothing traces the call."""
    params = (activation, scale, post_scale, causal, negative_slope)
    if not plain_eager(q, k, v, bias):
        return ops.attention_fwd(q, k, v, bias, *params)
    if _needs_grad(q, k, v, bias):
        return EagerAttention.apply(ops.EAGER_AUTOGRAD, ops.forward_impl, q, k, v, bias, *params)
    return ops.forward_impl(q, k, v, bias, *params)


def varlen_attention(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, *params) -> torch.Tensor:
    """``gdpa::varlen_fwd_v2`` with its autograd, through the fast path where nothing traces the call."""
    rows = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    if not plain_eager(q, k, v, bias, *rows):
        return varlen_ops.varlen_fwd(q, k, v, bias, *rows, *params)
    if _needs_grad(q, k, v, bias):
        return EagerAttention.apply(varlen_ops.EAGER_AUTOGRAD, varlen_ops.forward_impl, q, k, v, bias, *rows, *params)
    return varlen_ops.forward_impl(q, k, v, bias, *rows, *params)
