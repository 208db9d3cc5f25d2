"""The public GDPA functions: ``gdpa`` (dense, or jagged NestedTensors) and ``gdpa_varlen``."""

from __future__ import annotations

import torch

from .kernels.activations import ActivationName
from .lowering.eager import attention, varlen_attention
from .validation import check_gdpa_args
from .validation_varlen import check_varlen_args


def gdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    activation: ActivationName = "gelu_tanh",
    scale: float | None = None,
    post_scale: float = 1.0,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    negative_slope: float = 0.01,
) -> torch.Tensor:
    """Generalized Dot-Product Attention: ``act(scale * Q Kᵀ + bias) * post_scale @ V``, no softmax.

    Args:
        query: ``[..., H, Nq, D]``.
        key: ``[..., Hkv, Nk, D]``; H must be divisible by Hkv (grouped-query attention, query head
            h reads kv head ``h // (H // Hkv)``).
        value: ``[..., Hkv, Nk, Dv]``. Leading batch dims of the three broadcast against each other, so
            a query with batch 1 serves every sample (PMA's seed queries) without a copy.
        activation: one of identity, relu, relu_square, leaky_relu, gelu, gelu_tanh, silu, sigmoid,
            hardswish.
        scale: multiplies QKᵀ before the activation; None means 1.0 (no implicit 1/sqrt(D): the
            activations are not scale-invariant).
        post_scale: multiplies the activation's output (e.g. 1/N in HSTU).
        bias: added to the scores before the activation; broadcastable to ``[..., H, Nq, Nk]``; receives
            a gradient when it requires one.
        causal: keep key j for query i iff ``j <= i + Nk - Nq`` (bottom-right aligned); masked entries
            contribute exactly 0.
        negative_slope: the slope of leaky_relu.

    Jagged NestedTensors (``torch.nested``, ``layout=torch.jagged``) ``[B, H, j, D]`` are accepted for query
    and key/value (no bias): they run through ``gdpa_varlen`` and the result is a NestedTensor too.

    Returns:
        ``[..., H, Nq, Dv]`` in value's dtype. Differentiable in query, key, value and bias.
    """
    if any(isinstance(t, torch.Tensor) and t.is_nested for t in (query, key, value)):
        return _gdpa_nested(query, key, value, activation, scale, post_scale, bias, causal, negative_slope)
    check_gdpa_args(
        query, key, value, activation=activation, scale=1.0 if scale is None else scale,
        post_scale=post_scale, bias=bias, negative_slope=negative_slope, causal=causal,
    )
    return attention(
        query, key, value, bias, activation, 1.0 if scale is None else float(scale), float(post_scale),
        bool(causal), float(negative_slope),
    )


def gdpa_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    activation: ActivationName = "gelu_tanh",
    scale: float | None = None,
    post_scale: float = 1.0,
    causal: bool = False,
    window: int | tuple[int | None, int | None] | None = None,
    negative_slope: float = 0.01,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """GDPA over a jagged batch (FlashAttention's varlen layout); the work follows the real tokens.

    Args:
        q: ``[total_q, H, D]`` with ``cu_seqlens_q``; or, with ``cu_seqlens_q=None``, dense
            ``[B or 1, Nq, H, D]`` (a batch of 1 is shared by every sample without a copy: PMA's seeds).
        k, v: ``[total_k, Hkv, D]`` / ``[total_k, Hkv, Dv]`` with ``cu_seqlens_k``; or dense
            ``[B or 1, Nk, Hkv, D/Dv]`` (PFFN: every sample has Nk rows). H divisible by Hkv (GQA, blocked).
        cu_seqlens_q, cu_seqlens_k: int32 offsets of length B + 1, from 0 to the total row count.
        max_seqlen_q, max_seqlen_k: the longest sequence of each jagged side (sizes the launch; no sync).
        activation, scale, post_scale, negative_slope: as in ``gdpa``.
        causal: key j is kept for query i iff ``j <= i + nk - nq`` per sample (bottom-right aligned).
        window: a sliding window around that diagonal: ``(left, right)`` keeps ``-left <= j - i - (nk - nq)
            <= right`` (None or -1: unbounded on that side); an int w means ``(w, w)``. HSTU's
            ``max_attn_len`` is ``causal=True, window=(max_attn_len, 0)``.
        seqused_q, seqused_k: per-sample valid lengths: for a dense side (a padded batch), rows past them take
            no part, cost nothing, and get zero outputs and gradients; for a jagged side, only the first
            ``seqused[z]`` rows of sample z take part (a padded batch's ``N`` cutting longer samples short),
            the rest likewise.
        bias: added before the activation, broadcastable to ``[B, H, max_seqlen_q, max_seqlen_k]`` (a dense
            side's N for its max_seqlen) and indexed by the sample and the positions within it: sample z
            reads ``bias[z, :, :n_q(z), :n_k(z)]`` (a relative position bias ``[H, N, N]`` shared by the
            samples, or a padded batch's own ``[B, H, N, N]``). Gets a gradient when it requires one.

    Returns:
        ``[total_q, H, Dv]`` (jagged queries) or ``[B, Nq, H, Dv]`` (dense queries), in v's dtype. Samples
        with no queries or no keys give zeros (and zero gradients). Differentiable in q, k, v and bias.
    """
    left, right = check_varlen_args(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, activation=activation,
        scale=1.0 if scale is None else scale, post_scale=post_scale, window=window,
        negative_slope=negative_slope, seqused_q=seqused_q, seqused_k=seqused_k, bias=bias, causal=causal,
    )
    return varlen_attention(
        q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, int(max_seqlen_q), int(max_seqlen_k),
        activation, 1.0 if scale is None else float(scale), float(post_scale), bool(causal), left, right,
        float(negative_slope),
    )


def _jagged_rows(t: torch.Tensor, name: str):
    """(values [total, H, D], int32 offsets, longest) of a jagged NestedTensor [B, H, j, D]."""
    if t.layout != torch.jagged or t.dim() != 4 or t._ragged_idx != 2:
        raise ValueError(f"{name}: expected a jagged NestedTensor [B, H, j, D] (ragged sequence dim 2, as "
                         f"nt.transpose(1, 2) of [B, j, H, D]); got layout {t.layout}, dim {t.dim()}")
    offsets = t.offsets().to(torch.int32)
    longest = t._maybe_max_seqlen
    if longest is None:
        longest = int((offsets[1:] - offsets[:-1]).max()) if offsets.numel() > 1 else 0
    # The values of a [B, H, j, D] view are its [H, total, D] buffer, transposed back here (no copy).
    return t.values().transpose(0, 1), offsets, int(longest)


def _gdpa_nested(query, key, value, activation, scale, post_scale, bias, causal, negative_slope):
    if bias is not None:
        raise ValueError("bias: not supported with NestedTensor inputs (use gdpa_varlen's window/causal)")
    if key.is_nested != value.is_nested:
        raise ValueError("key/value: expected both NestedTensors or both dense")
    if query.is_nested:
        q, cu_q, max_q = _jagged_rows(query, "query")
    else:
        q, cu_q, max_q = query.transpose(-3, -2), None, query.shape[-2]
    if key.is_nested:
        k, cu_k, max_k = _jagged_rows(key, "key")
        v, _, _ = _jagged_rows(value, "value")
        if query.is_nested and key.offsets() is query.offsets():
            # one offsets tensor for both sides (self attention), as the CuTe kernels' causal mask asks
            # (varlen_causal_support): each side's int32 copy would be a tensor of its own
            cu_k = cu_q
    else:
        k, v, cu_k, max_k = key.transpose(-3, -2), value.transpose(-3, -2), None, key.shape[-2]
    out = gdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, activation=activation, scale=scale,
                      post_scale=post_scale, causal=causal, negative_slope=negative_slope)
    if cu_q is None:
        return out.transpose(-3, -2)
    nested = torch.nested.nested_tensor_from_jagged(out, query.offsets(), max_seqlen=max_q)
    return nested.transpose(1, 2)
