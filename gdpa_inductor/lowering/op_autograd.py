"""The autograd of the GDPA ops, written once: the custom ops register it, and the eager fast path (``eager``) runs
the same steps through one ``torch.autograd.Function`` with the kernels' implementations in place of the ops."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable


class OpAutograd:
    """An op's inputs are q, k, v, bias, then ``saved - 4`` row tensors (varlen), then plain parameters: the
    ``saved`` leading inputs are saved for the backward (S is recomputed there), the rest kept as they are.
    ``backward(dout, *saved, *params, bias_grad)`` gives (dq, dk, dv, dbias or None)."""

    def __init__(self, saved: int, backward: Callable):
        self.saved = saved
        self.backward_fn = backward

    def setup_context(self, ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[:self.saved])
        ctx.params = tuple(inputs[self.saved:])

    def gradients(self, ctx, dout, bias_wanted: bool) -> tuple:
        """The inputs' gradients: q's, k's, v's, bias's where ``bias_wanted`` (its needs_input_grad), then Nones."""
        saved = ctx.saved_tensors
        bias_grad = saved[3] is not None and bias_wanted
        dq, dk, dv, dbias = self.backward_fn(dout, *saved, *ctx.params, bias_grad)
        return (dq, dk, dv, dbias if bias_grad else None) + (None,) * (len(saved) - 4 + len(ctx.params))

    def backward(self, ctx, dout) -> tuple:
        return self.gradients(ctx, dout, ctx.needs_input_grad[3])

    def register(self, op) -> None:
        """Registers this autograd on the custom op ``op``."""
        op.register_autograd(self.backward, setup_context=self.setup_context)


class EagerAttention(torch.autograd.Function):
    """``forward_impl(*inputs)`` with ``grad``'s autograd (an ``OpAutograd`` calling the backward's
    implementation), for calls nothing traces."""

    @staticmethod
    def forward(ctx, grad: OpAutograd, forward_impl: Callable, *inputs):
        grad.setup_context(ctx, inputs, None)
        ctx.grad = grad
        return forward_impl(*inputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        # the first two inputs are the autograd and the implementation
        return None, None, *ctx.grad.gradients(ctx, dout, ctx.needs_input_grad[5])
