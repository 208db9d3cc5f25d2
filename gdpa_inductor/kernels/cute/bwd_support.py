"""Which calls the CuTe-DSL backwards take: the Hopper backward the forward's cases (``fwd_support``) at the backward's
head dims, and its biases and bias gradients; the Blackwell backward (``sm100_bwd_supported``) its dense calls; each
an (ok, reason) check."""

from __future__ import annotations

import torch

from ..activations import ActivationName
from .bwd_plan import NARROW_MAX_HEAD_DIM
from .dbias_plan import dbias_sums_for
from .fwd_support import cute_dsl_available, cute_fwd_support, fwd_supported, on_sm100, operand_support
from .operand_views import bias_4d, flatten_batch, is_tensor_bias

# the forward's head dims: past NARROW_MAX_HEAD_DIM the wide-head kernel (``bwd_plan``)
BWD_HEAD_DIMS = (64, 96, 128, 256)


def _within_bwd_head_dims(check: tuple[bool, str], q: torch.Tensor, v: torch.Tensor) -> tuple[bool, str]:
    """A forward support check's (ok, reason), narrowed to the backward's head dims."""
    d, dv = q.shape[-1], v.shape[-1]
    if check[0] and not (d in BWD_HEAD_DIMS and dv in BWD_HEAD_DIMS):
        return False, f"head dims (D={d}, Dv={dv}) must each be one of {BWD_HEAD_DIMS} for the CuTe backward"
    return check


def bias_tensor_bwd_support(bias: torch.Tensor, q: torch.Tensor, v: torch.Tensor) -> tuple[bool, str]:
    """(ok, reason) for a bias tensor the forward takes (``score_bias_support``, in its 4-D form) in the CuTe
    backward: the 128-key kernel (D and Dv at most 128), which loads each (64 queries x 128 keys) tile of it by TMA
    (from a padded copy where TMA cannot read it in place, ``tma_bias``)."""
    d, dv = q.shape[-1], v.shape[-1]
    if max(d, dv) > NARROW_MAX_HEAD_DIM:
        return False, f"the CuTe backward reads a bias tensor at D and Dv up to {NARROW_MAX_HEAD_DIM} (got {d}, {dv})"
    return True, ""


def bwd_bias_support(check: tuple[bool, str], bias, q: torch.Tensor, v: torch.Tensor,
                     bias_grad: bool, samples_heads: tuple[int, int] = (1, 1),
                     varlen: bool = False) -> tuple[bool, str]:
    """A forward support check's (ok, reason) on the operands and their bias (dense: in its 4-D form), narrowed to
    the backward's biases (one element, or a tensor ``bias_tensor_bwd_support`` takes) and bias gradients (of a
    tensor only, summed in a tensor that fits, ``dbias_sums_for``; ``samples_heads``: the batch's (Z or B, H),
    ``varlen``: whether it is a varlen batch)."""
    if not check[0] or bias is None:
        return check
    if not is_tensor_bias(bias):
        return (False, "the CuTe backward computes the gradient of a bias tensor only") if bias_grad else check
    ok, reason = bias_tensor_bwd_support(bias, q, v)
    if ok and bias_grad:
        way, reason = dbias_sums_for(*samples_heads, bias, varlen)
        return way is not None, reason
    return ok, reason


def bwd_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName,
                  bias_grad: bool = False):
    """(ok, reason) for the CuTe backward on [Z, H, N, D] operands (a bias in the 4-D form): the forward's cases at
    the backward's head dims, a bias tensor where ``bias_tensor_bwd_support`` takes it, a bias gradient
    (``bias_grad``: whether the call wants one) of a bias tensor."""
    check = _within_bwd_head_dims(fwd_supported(q, k, v, bias, causal, activation), q, v)
    return bwd_bias_support(check, bias, q, v, bias_grad, q.shape[:2])


def cute_bwd_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName,
                     bias_grad: bool = False):
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting): the forward's cases, its
    causal mask and biases included (``causal_support``, ``score_bias_support``), at the backward's head dims, as
    ``bwd_supported`` narrows them."""
    check = _within_bwd_head_dims(cute_fwd_support(q, k, v, bias, causal, activation), q, v)
    if not check[0] or bias is None:
        return bwd_bias_support(check, bias, q, v, bias_grad)
    (q4, _, v4), batch = flatten_batch(q, k, v)
    return bwd_bias_support(check, bias_4d(bias, batch, q4.shape[2]), q4, v4, bias_grad, q4.shape[:2])


def sm100_bwd_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, bias, causal: bool,
                        activation: ActivationName, bias_grad: bool = False) -> tuple[bool, str]:
    """(ok, reason) for the Blackwell backward (``GdpaBwdSm100``, launched by ``gdpa_bwd.gdpa_bwd_cute_sm100``) on
    [Z, H, N, D] operands: an sm_100 GPU, a bias ``sm100_bwd_bias_support`` takes (the 4-D view of the op's,
    ``operand_views.bias_4d``), D = Dv in
    ``SM100_BWD_HEAD_DIMS``, grad_out of q's shape and dtype, and ``operand_support``'s dtypes and TMA layouts (grad_out
    is copied where TMA cannot read it). Empty query or key ranges take no kernel (zero gradients). The dispatch asks
    it on sm_100 (``lowering/sm100_backward.py``), then the self-check of the call's build: no Blackwell GPU in this
    project's tests has run the kernel."""
    from .bwd_plan import SM100_BWD_HEAD_DIMS

    kernel = "the CuTe Blackwell backward"
    if not cute_dsl_available():
        return False, "nvidia-cutlass-dsl or apache-tvm-ffi is not installed"
    if not on_sm100(q.device):
        return False, f"{kernel} is built for sm_100"
    ok, reason = sm100_bwd_bias_support(bias, bias_grad, q, k, kernel)
    if not ok:
        return ok, reason
    if q.shape[-1] != v.shape[-1]:
        return False, f"{kernel} needs D = Dv (got D={q.shape[-1]}, Dv={v.shape[-1]})"
    if k.shape[:-1] != v.shape[:-1] or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
        return False, (f"{kernel} needs k and v of one shape but the last dim, q's batch, and q's heads a multiple of "
                       f"k's (got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)})")
    if grad_out.shape != (*q.shape[:-1], v.shape[-1]) or grad_out.dtype != q.dtype:
        return False, (f"{kernel} needs grad_out of shape {(*q.shape[:-1], v.shape[-1])} and dtype {q.dtype} (got "
                       f"{tuple(grad_out.shape)}, {grad_out.dtype})")
    return operand_support(q, k, v, activation, SM100_BWD_HEAD_DIMS, kernel=kernel)


def sm100_bwd_bias_support(bias, bias_grad: bool, q: torch.Tensor, k: torch.Tensor,
                           kernel: str = "the CuTe Blackwell backward") -> tuple[bool, str]:
    """(ok, reason) for the Blackwell backward's bias: one element of a float dtype (no gradient), or a [Zb, Hb, Nq, Nk]
    tensor (Zb 1 or Z, Hb 1 or H) in q's dtype or fp32 with its keys contiguous; its gradient a tensor's, summed
    from a [Z, H, Nq, Nk] dS buffer that must fit in half the memory the device can still allocate."""
    from .dbias_plan import dbias_sums_for

    if bias is None:
        return (False, "bias_grad=True needs a bias tensor") if bias_grad else (True, "")
    if bias.numel() == 1:
        if bias_grad:
            return False, f"{kernel} takes a bias gradient of a tensor only (got one element)"
        return (True, "") if bias.dtype.is_floating_point else (False, f"a bias of a float dtype (got {bias.dtype})")
    z, h, nq = q.shape[:3]
    nk = k.shape[2]
    if bias.dim() != 4 or tuple(bias.shape[2:]) != (nq, nk) or bias.shape[0] not in (1, z) or bias.shape[1] not in (
            1, h):
        return False, f"{kernel} takes a bias of shape [1 or {z}, 1 or {h}, {nq}, {nk}] (got {tuple(bias.shape)})"
    if bias.dtype not in (q.dtype, torch.float32):
        return False, f"{kernel} takes a bias in the operands' dtype or float32 (got {bias.dtype})"
    if bias.stride(-1) != 1:
        return False, f"{kernel} reads a bias with its keys contiguous (got strides {bias.stride()})"
    if bias_grad:
        way, reason = dbias_sums_for(z, h, bias)
        if way != "buffer":
            return False, reason or f"{kernel} sums dbias in a buffer of every (sample, head)'s dS, which does not fit"
    return True, ""
