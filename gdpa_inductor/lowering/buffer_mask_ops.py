"""GDPA whose causal mask is read from a graph input (a module buffer, a float mask passed in): causal while the
input holds it, exact when not.

- ``gdpa::attention_buffer_mask_fwd_v1(q, k, v, bias?, seqused_q?, seqused_k?, multiplier, source, activation,
  scale, post_scale, negative_slope) -> out``: ``O = (act(scale · Q Kᵀ + bias) · post_scale · multiplier) V`` on
  [B, H, N, D] tensors, with the rows (``seqused_q``) and columns (``seqused_k``) past each sample's length
  zeroed when given (a padded batch: the varlen kernels then skip them)
- ``gdpa::attention_buffer_mask_bwd_v1(dout, ..., bias_requires_grad) -> (dq, dk, dv, dbias)``

A mask such as ``self.mask[:n, :n]`` of a ``tril`` buffer is causal when the model is compiled, but the buffer
can change afterwards (``load_state_dict``, ``fill_``) without a recompile; so can a float mask that another graph
computes and passes in (``1.0 - triu(...).float()``). The rewrite therefore passes the mask (``multiplier``, in its
keep form: 1 or True where a score is kept) and the graph input it is read from (``source``). Each call asks
``is_causal_keep_mask``: the answer is cached by the source's address and version counter (every in-place write
bumps it, and the cache holds the source so that its address cannot be reused), so the mask's values are checked
once (one device-to-host read) per state of the source: once for a buffer, once per step for a mask made anew each
step. While it is causal the op runs the fused causal kernels; otherwise it computes the graph's answer with the
mask as it is. The ops are tagged ``cudagraph_unsafe``: a CUDA graph would replay the answer of its recording.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..kernels.reference import gdpa_reference, gdpa_reference_backward
from . import ops, varlen_ops

# (source address, version, mask shape, dtype, device) -> (source, is causal); the oldest states are dropped past
# either bound (a mask made anew each step adds one state per step).
_CHECKED: OrderedDict[tuple, tuple[torch.Tensor, bool]] = OrderedDict()
MAX_CHECKED_STATES = 64
MAX_HELD_BYTES = 256 << 20


def is_causal_keep_mask(multiplier: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether ``multiplier`` (read from ``source``) is exactly the causal keep mask: 1 on and below the diagonal
    of a square [..., N, N], 0 above, the same in every leading index."""
    try:
        key = (source.data_ptr(), source._version, tuple(multiplier.shape), multiplier.dtype, multiplier.device)
    except RuntimeError:  # an inference tensor has no version counter: check the values every call
        key = None
    if key is not None and key in _CHECKED:
        _CHECKED.move_to_end(key)
        return _CHECKED[key][1]
    causal = _values_are_causal(multiplier)
    if key is not None:
        _CHECKED[key] = (source, causal)
        while len(_CHECKED) > 1 and (len(_CHECKED) > MAX_CHECKED_STATES or _held_bytes() > MAX_HELD_BYTES):
            _CHECKED.popitem(last=False)
    return causal


def _held_bytes() -> int:
    return sum(t.untyped_storage().nbytes() for t, _ in _CHECKED.values())


def _values_are_causal(multiplier: torch.Tensor) -> bool:
    if multiplier.dim() < 2 or multiplier.shape[-1] != multiplier.shape[-2]:
        return False
    n = multiplier.shape[-1]
    tril = torch.ones(n, n, dtype=torch.bool, device=multiplier.device).tril()
    return bool((multiplier.reshape(-1, n, n) == tril).all())


def _with_lengths(multiplier, q, k, seqused_q, seqused_k):
    """The multiplier times the padding mask: rows and columns past each sample's length are zero."""
    keep = multiplier
    if seqused_q is not None:
        rows = torch.arange(q.shape[-2], device=q.device)[None, :] < seqused_q[:, None]
        keep = keep * rows[:, None, :, None]
    if seqused_k is not None:
        cols = torch.arange(k.shape[-2], device=k.device)[None, :] < seqused_k[:, None]
        keep = keep * cols[:, None, None, :]
    return keep


def _fast_forward(q, k, v, bias, seqused_q, seqused_k, activation, scale, post_scale, negative_slope):
    if seqused_q is None and seqused_k is None:
        return ops.forward_impl(q, k, v, bias, activation, scale, post_scale, True, negative_slope)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    out = varlen_ops.forward_impl(qt, kt, vt, bias, None, None, seqused_q, seqused_k, 0, 0, activation, scale,
                                  post_scale, True, -1, -1, negative_slope)
    return out.transpose(1, 2).contiguous()


def _fast_backward(dout, q, k, v, bias, seqused_q, seqused_k, activation, scale, post_scale, negative_slope,
                   bias_requires_grad):
    if seqused_q is None and seqused_k is None:
        return ops.backward_impl(dout, q, k, v, bias, activation, scale, post_scale, True, negative_slope,
                                 bias_requires_grad)
    dt, qt, kt, vt = (x.transpose(1, 2) for x in (dout, q, k, v))
    dq, dk, dv, dbias = varlen_ops.backward_impl(dt, qt, kt, vt, bias, None, None, seqused_q, seqused_k, 0, 0,
                                                 activation, scale, post_scale, True, -1, -1, negative_slope,
                                                 bias_requires_grad)
    return (*(g.transpose(1, 2).contiguous() for g in (dq, dk, dv)), dbias)


@torch.library.custom_op("gdpa::attention_buffer_mask_fwd_v1", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def attention_buffer_mask_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    multiplier: torch.Tensor,
    source: torch.Tensor,
    activation: str,
    scale: float,
    post_scale: float,
    negative_slope: float,
) -> torch.Tensor:
    if is_causal_keep_mask(multiplier, source):
        return _fast_forward(q, k, v, bias, seqused_q, seqused_k, activation, scale, post_scale, negative_slope)
    keep = _with_lengths(multiplier, q, k, seqused_q, seqused_k)
    return gdpa_reference(q, k, v, bias, activation, scale, post_scale, False, negative_slope, multiplier=keep)


@attention_buffer_mask_fwd.register_fake
def _fwd_fake(q, k, v, bias, seqused_q, seqused_k, multiplier, source, activation, scale, post_scale,
              negative_slope):
    return v.new_empty((*ops._broadcast_batch(q, k, v), q.shape[-3], q.shape[-2], v.shape[-1]))


@torch.library.custom_op("gdpa::attention_buffer_mask_bwd_v1", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def attention_buffer_mask_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    multiplier: torch.Tensor,
    source: torch.Tensor,
    activation: str,
    scale: float,
    post_scale: float,
    negative_slope: float,
    bias_requires_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    params = (activation, scale, post_scale, negative_slope)
    if is_causal_keep_mask(multiplier, source):
        grads = _fast_backward(dout, q, k, v, bias, seqused_q, seqused_k, *params, bias_requires_grad)
    else:
        keep = _with_lengths(multiplier, q, k, seqused_q, seqused_k)
        grads = gdpa_reference_backward(dout, q, k, v, bias, activation, scale, post_scale, False, negative_slope,
                                        bias_requires_grad, multiplier=keep)
    dq, dk, dv, dbias = grads
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0)


@attention_buffer_mask_bwd.register_fake
def _bwd_fake(dout, q, k, v, bias, seqused_q, seqused_k, multiplier, source, activation, scale, post_scale,
              negative_slope, bias_requires_grad):
    dbias = bias.new_empty(bias.shape) if bias is not None and bias_requires_grad else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, bias, seqused_q, seqused_k, multiplier, source, activation, scale, post_scale, negative_slope = inputs
    ctx.save_for_backward(q, k, v, bias, seqused_q, seqused_k, multiplier, source)
    ctx.params = (activation, scale, post_scale, negative_slope)


def _backward(ctx, dout):
    q, k, v, bias, seqused_q, seqused_k, multiplier, source = ctx.saved_tensors
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias = attention_buffer_mask_bwd(dout, q, k, v, bias, seqused_q, seqused_k, multiplier, source,
                                                  *ctx.params, bias_grad)
    return dq, dk, dv, dbias if bias_grad else None, *(None,) * 8


attention_buffer_mask_fwd.register_autograd(_backward, setup_context=_setup_context)
