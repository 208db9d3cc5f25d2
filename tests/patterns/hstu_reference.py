"""HSTU attention as generative-recommenders' pure-PyTorch reference (``pytorch_hstu_mha``) computes it, step by
step, with fbgemm's jagged ops replaced by pure-torch equivalents in two spellings: a gather times a validity
mask that Dynamo traces through, and an opaque custom op with fbgemm's signature and autograd.

Jagged q, k, v [L, H, D] are padded to [B, H, N, D], the scores are ``einsum`` times alpha, ``silu(.) / N`` (or
times a per-token ``attn_scale``), times the reference's mask (causal or not, ``max_attn_len``, contextual
positions, targets), ``einsum`` with V, and the result goes back to jagged rows.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


def pad_by_gather(values: torch.Tensor, offsets: torch.Tensor, n: int) -> torch.Tensor:
    """[L, E] -> [B, N, E], zeros past each sample's length: row i of sample b is values[offsets[b] + i]."""
    lengths = offsets[1:] - offsets[:-1]
    pos = torch.arange(n, device=values.device)[None, :]
    src = (offsets[:-1, None] + pos).clamp(max=values.shape[0] - 1)
    valid = (pos < lengths[:, None]).unsqueeze(-1)
    return values[src] * valid


@torch.library.custom_op("gdpa_testing::pad_jagged", mutates_args=())
def _pad_jagged(values: torch.Tensor, offsets: torch.Tensor, n: int, padding_value: float) -> torch.Tensor:
    out = values.new_full((offsets.numel() - 1, n, values.shape[-1]), padding_value)
    for b in range(offsets.numel() - 1):
        rows = values[int(offsets[b]):int(offsets[b + 1])][:n]
        out[b, :rows.shape[0]] = rows
    return out


@_pad_jagged.register_fake
def _(values, offsets, n, padding_value):
    return values.new_empty((offsets.shape[0] - 1, n, values.shape[-1]))


@torch.library.custom_op("gdpa_testing::unpad_jagged", mutates_args=())
def padded_dense_to_jagged(dense: torch.Tensor, offsets: torch.Tensor, total: int) -> torch.Tensor:
    """The rows of a padded [B, N, E] batch that hold data, as [total, E]; an opaque op."""
    out = dense.new_zeros((total, dense.shape[-1]))
    for b in range(offsets.numel() - 1):
        start, end = int(offsets[b]), int(offsets[b + 1])
        rows = dense[b, :end - start]
        out[start:start + rows.shape[0]] = rows
    return out


@padded_dense_to_jagged.register_fake
def _(dense, offsets, total):
    return dense.new_empty((total, dense.shape[-1]))


def _pad_setup(ctx, inputs, output):
    values, offsets, _, _ = inputs
    ctx.offsets, ctx.total = offsets, values.shape[0]


def _unpad_setup(ctx, inputs, output):
    dense, offsets, _ = inputs
    ctx.offsets, ctx.n = offsets, dense.shape[1]


_pad_jagged.register_autograd(
    lambda ctx, grad: (padded_dense_to_jagged(grad, ctx.offsets, ctx.total), None, None, None),
    setup_context=_pad_setup)
padded_dense_to_jagged.register_autograd(
    lambda ctx, grad: (_pad_jagged(grad, ctx.offsets, ctx.n, 0.0), None, None), setup_context=_unpad_setup)


def jagged_to_padded_dense(values: torch.Tensor, offsets: list[torch.Tensor], max_lengths: list[int],
                           padding_value: float = 0.0) -> torch.Tensor:
    """fbgemm's ``jagged_to_padded_dense`` for one jagged dim (its signature), through an opaque op."""
    return _pad_jagged(values, offsets[0], max_lengths[0], padding_value)


def unpad_by_index(dense: torch.Tensor, offsets: torch.Tensor, total: int) -> torch.Tensor:
    """[B, N, E] -> [L, E]: the rows that hold data (flat b * N + i indices, gathered)."""
    b, n, e = dense.shape
    sample = torch.searchsorted(offsets, torch.arange(total, device=dense.device), right=True) - 1
    pos = torch.arange(total, device=dense.device) - offsets[sample]
    return dense.reshape(b * n, e)[sample * n + pos]


def valid_attn_mask(n: int, device, causal: bool, seq_lengths: torch.Tensor, num_targets: Optional[torch.Tensor],
                    max_attn_len: int, contextual_seq_len: int) -> torch.Tensor:
    """The reference's [1 or B, N, N] boolean mask of the pairs a query attends to."""
    ids = torch.arange(0, n, device=device).view(1, n)
    max_ids = seq_lengths.view(-1, 1, 1)
    if contextual_seq_len > 0:
        ids = torch.clamp(ids - contextual_seq_len + 1, min=0)
        max_ids = max_ids - contextual_seq_len + 1
    if num_targets is not None:
        max_ids = max_ids - num_targets.view(-1, 1, 1)
        ids = torch.clamp(ids, max=max_ids)
        row_ids = ids.view(-1, n, 1).expand(-1, n, n)
        col_ids = ids.view(-1, 1, n).expand(-1, n, n)
    else:
        row_ids = ids.view(n, 1).expand(n, n)
        col_ids = row_ids.t()
        row_ids, col_ids = row_ids.view(1, n, n), col_ids.view(1, n, n)
    dist = row_ids - col_ids
    mask = torch.eye(n, device=device, dtype=torch.bool).view(1, n, n)
    if not causal:
        dist = torch.where(dist > 0, dist, -dist)
    mask = torch.logical_or(mask, dist > 0)
    if max_attn_len > 0:
        mask = torch.logical_and(mask, dist <= max_attn_len)
    if contextual_seq_len > 0:
        mask = torch.logical_or(mask, torch.logical_and(row_ids == 0, col_ids < max_ids))
    return mask


class HSTUReferenceMHA(nn.Module):
    """``pytorch_hstu_mha``'s computation; ``padding`` is "gather" (traced) or "custom_op" (opaque, fbgemm's
    signature)."""

    def __init__(self, n: int, alpha: float = 0.5, causal: bool = True, max_attn_len: int = 0,
                 contextual_seq_len: int = 0, padding: str = "gather"):
        super().__init__()
        self.n, self.alpha, self.causal = n, alpha, causal
        self.max_attn_len, self.contextual_seq_len, self.padding = max_attn_len, contextual_seq_len, padding

    def _pad(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        length, h, d = x.shape
        values = x.reshape(length, h * d)
        if self.padding == "gather":
            dense = pad_by_gather(values, offsets, self.n)
        else:
            dense = jagged_to_padded_dense(values, [offsets], [self.n], 0.0)
        return dense.view(-1, self.n, h, d).transpose(1, 2)

    def _unpad(self, dense: torch.Tensor, offsets: torch.Tensor, total: int) -> torch.Tensor:
        if self.padding == "gather":
            return unpad_by_index(dense, offsets, total)
        return padded_dense_to_jagged(dense, offsets, total)

    def forward(self, q, k, v, offsets, num_targets=None, attn_scale=None):
        total, h, _ = q.shape
        dv = v.shape[2]
        qp, kp, vp = (self._pad(x, offsets) for x in (q, k, v))
        attn = torch.einsum("bhxa,bhya->bhxy", qp, kp) * self.alpha
        if attn_scale is not None:
            attn = F.silu(attn) * self._pad(attn_scale.view(total, 1, 1), offsets).to(attn.dtype)  # [B, 1, N, 1]
        else:
            attn = F.silu(attn) / self.n
        mask = valid_attn_mask(self.n, q.device, self.causal, offsets[1:] - offsets[:-1], num_targets,
                               self.max_attn_len, self.contextual_seq_len)
        attn = attn * mask.unsqueeze(1)
        out = torch.einsum("bhxd,bhdv->bhxv", attn, vp)
        return self._unpad(out.transpose(1, 2).flatten(2, 3), offsets, total).view(total, h, dv)


def jagged_inputs(gen: torch.Generator, lengths: list[int], h: int = 2, d: int = 8) -> tuple:
    """q, k, v [L, H, D] and offsets [B + 1] (int64) for these per-sample lengths."""
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    total = int(offsets[-1])
    return (*(torch.randn(total, h, d, generator=gen) for _ in range(3)), offsets)
