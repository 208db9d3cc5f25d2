"""The public GDPA function."""

from __future__ import annotations

import torch

from .lowering.ops import attention_fwd
from .validation import check_gdpa_args


def gdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    activation: str = "gelu_tanh",
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

    Returns:
        ``[..., H, Nq, Dv]`` in value's dtype. Differentiable in query, key, value and bias.
    """
    check_gdpa_args(
        query, key, value, activation=activation, scale=1.0 if scale is None else scale,
        post_scale=post_scale, bias=bias, negative_slope=negative_slope,
    )
    return attention_fwd(
        query, key, value, bias, activation, 1.0 if scale is None else float(scale), float(post_scale),
        bool(causal), float(negative_slope),
    )
