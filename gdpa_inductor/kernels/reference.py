"""Pure-PyTorch GDPA: the semantics every kernel is tested against, and the fallback on any device.

    S = scale * Q Kᵀ + bias;  P = act(S) * post_scale * keep * multiplier;  O = P V
    dV = Pᵀ dO;  dS = (dO Vᵀ) * act'(S) * post_scale * keep;  dQ = scale dS K;  dK = scale dSᵀ Q

Half-precision inputs are computed in fp32 (fp64 stays fp64) and the result is cast back. Grouped-query
attention is a reshape of the query heads into (Hkv, group), so no key or value is repeated; broadcast
batch dimensions (PMA's shared seed query) broadcast in the matmuls and their gradients are summed back.
The backward is written out (no autograd) so that it can run inside a custom op, below autograd.
"""

from __future__ import annotations

import torch

from .activations import ActivationName, get_activation


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def causal_keep_mask(nq: int, nk: int, device) -> torch.Tensor:
    """keep[i, j] = j <= i + (nk - nq): bottom-right aligned, as FlashAttention does."""
    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril(nk - nq)


def band_keep_mask(nq: int, nk: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor | None:
    """keep[i, j] for the offset ``d = j - i - (nk - nq)`` from the bottom-right aligned diagonal: ``d <= 0``
    when causal, ``-left <= d <= right`` for ``window = (left, right)`` (-1: unbounded on that side).
    None when everything is kept."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left < 0 and right < 0:
        return None
    keep = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if right >= 0:
        keep = keep.tril(nk - nq + right)
    if left >= 0:
        keep = keep.triu(nk - nq - left)
    return keep


def _grouped_views(q, k, v, bias):
    """Views with the query heads split into (Hkv, group); k and v get a size-1 group dim."""
    h, hkv = q.shape[-3], k.shape[-3]
    group = h // hkv if hkv else 1
    ct = _compute_dtype(v.dtype)
    qg = q.to(ct).unflatten(-3, (hkv, group))
    kg = k.to(ct).unsqueeze(-3)
    vg = v.to(ct).unsqueeze(-3)
    bg = None
    if bias is not None:
        batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
        full = (*batch, h, q.shape[-2], k.shape[-2])
        bg = bias.to(ct).expand(full).unflatten(-3, (hkv, group))
    return qg, kg, vg, bg


def _grouped_multiplier(multiplier, q, k, v, dtype):
    batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    full = (*batch, q.shape[-3], q.shape[-2], k.shape[-2])
    return multiplier.to(dtype).expand(full).unflatten(-3, (k.shape[-3], q.shape[-3] // max(k.shape[-3], 1)))


def _scores(qg, kg, bg, scale):
    s = torch.matmul(qg, kg.transpose(-2, -1)) * scale
    return s if bg is None else s + bg


def gdpa_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: ActivationName = "gelu_tanh",
    scale: float = 1.0,
    post_scale: float = 1.0,
    causal: bool = False,
    negative_slope: float = 0.01,
    window: tuple[int, int] = (-1, -1),
    multiplier: torch.Tensor | None = None,
) -> torch.Tensor:
    """``multiplier``: a tensor broadcast to the scores [..., H, Nq, Nk] that multiplies P (a mask of any
    value); its gradient is not computed."""
    act = get_activation(activation)
    qg, kg, vg, bg = _grouped_views(q, k, v, bias)
    s = _scores(qg, kg, bg, scale)
    p = act.torch_fn(s, negative_slope) * post_scale
    if multiplier is not None:
        p = p * _grouped_multiplier(multiplier, q, k, v, s.dtype)
    keep = band_keep_mask(q.shape[-2], k.shape[-2], causal, window, q.device)
    if keep is not None:
        p = torch.where(keep, p, 0.0)
    out = torch.matmul(p, vg).flatten(-4, -3)
    return out.to(v.dtype).contiguous()


def gdpa_reference_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: ActivationName = "gelu_tanh",
    scale: float = 1.0,
    post_scale: float = 1.0,
    causal: bool = False,
    negative_slope: float = 0.01,
    bias_requires_grad: bool = False,
    window: tuple[int, int] = (-1, -1),
    multiplier: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Returns (dq, dk, dv, dbias), each contiguous in its input's shape and dtype; dbias is None
    unless ``bias_requires_grad``."""
    act = get_activation(activation)
    qg, kg, vg, bg = _grouped_views(q, k, v, bias)
    dog = dout.to(qg.dtype).unflatten(-3, qg.shape[-4:-2])
    s = _scores(qg, kg, bg, scale)
    p = act.torch_fn(s, negative_slope) * post_scale
    ds = torch.matmul(dog, vg.transpose(-2, -1)) * act.torch_grad(s, negative_slope) * post_scale
    if multiplier is not None:
        grouped = _grouped_multiplier(multiplier, q, k, v, s.dtype)
        p, ds = p * grouped, ds * grouped
    keep = band_keep_mask(q.shape[-2], k.shape[-2], causal, window, q.device)
    if keep is not None:
        p = torch.where(keep, p, 0.0)
        ds = torch.where(keep, ds, 0.0)
    dv = torch.matmul(p.transpose(-2, -1), dog).sum(-3)
    dq = (torch.matmul(ds, kg) * scale).flatten(-4, -3)
    dk = (torch.matmul(ds.transpose(-2, -1), qg) * scale).sum(-3)
    dbias = None
    if bias is not None and bias_requires_grad:
        dbias = _reduce_to(ds.flatten(-4, -3), bias)

    return _reduce_to(dq, q), _reduce_to(dk, k), _reduce_to(dv, v), dbias


def _reduce_to(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sums a gradient over the dimensions ``like`` was broadcast along."""
    return grad.sum_to_size(like.shape).to(like.dtype).contiguous()
