"""Varlen test helpers: random jagged batches in every layout, and an independent float64 oracle (a loop over
samples in plain PyTorch with autograd; it does not use the package)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gdpa_testing import EAGER_ACTIVATIONS, randn

# A batch with empty, single-token and longer-than-a-tile samples.
LENGTHS_Q = [5, 0, 17, 1, 40, 3]
LENGTHS_K = [9, 4, 17, 0, 33, 1]
LAYOUTS = ["self", "cross", "pma", "pffn", "padded", "self_cut"]
MASKS = {"none": (False, None), "causal": (True, None), "window": (False, (3, 2)), "hstu": (True, (4, 0)),
         "left_only": (False, (2, None))}


def cu_of(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


@dataclass
class VarlenCase:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict  # cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k
    lq: list[int]
    lk: list[int]

    def inputs(self, dtype):
        return tuple(t.detach().to(dtype).requires_grad_() for t in (self.q, self.k, self.v))

    def to(self, device) -> "VarlenCase":
        # one tensor given for both sides stays one tensor (the CuTe kernels' causal rule asks for that)
        moved = {}
        kw = {n: moved.setdefault(id(t), t.to(device)) if isinstance(t, torch.Tensor) else t
              for n, t in self.kwargs.items()}
        return VarlenCase(self.q.to(device), self.k.to(device), self.v.to(device), kw, self.lq, self.lk)


def make_case(layout: str, gen, h=4, hkv=2, d=16, dv=24, lq=None, lk=None) -> VarlenCase:
    """A random batch in ``layout``: one of ``LAYOUTS``, or "padded_self" (a padded batch whose keys have the
    queries' lengths, both sides given one seqused tensor). "self" gives both sides one cu_seqlens tensor;
    "self_cut" too, with one seqused tensor that cuts some samples short (an empty one, an uncut one)."""
    lq = list(lq or LENGTHS_Q)
    lk = list(lk or LENGTHS_K)
    b = len(lq)
    kw = dict(cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None)
    if layout in ("self", "padded_self", "self_cut"):
        lk = lq
    if layout in ("self", "cross", "pffn", "self_cut"):
        q = randn(gen, sum(lq), h, d, dtype=torch.float64)
        kw["cu_seqlens_q"] = cu_of(lq)
    if layout in ("self", "cross", "pma", "self_cut"):
        k = randn(gen, sum(lk), hkv, d, dtype=torch.float64)
        v = randn(gen, sum(lk), hkv, dv, dtype=torch.float64)
        kw["cu_seqlens_k"] = cu_of(lk)
    if layout == "pma":  # one seed block shared by every sample
        lq = [7] * b
        q = randn(gen, 1, 7, h, d, dtype=torch.float64)
    if layout == "pffn":  # every sample has its own dense weights
        lk = [12] * b
        k = randn(gen, b, 12, hkv, d, dtype=torch.float64)
        v = randn(gen, b, 12, hkv, dv, dtype=torch.float64)
    if layout in ("padded", "padded_self"):
        q = randn(gen, b, max(lq), h, d, dtype=torch.float64)
        k = randn(gen, b, max(lk), hkv, d, dtype=torch.float64)
        v = randn(gen, b, max(lk), hkv, dv, dtype=torch.float64)
        kw["seqused_q"] = torch.tensor(lq, dtype=torch.int32)
        kw["seqused_k"] = torch.tensor(lk, dtype=torch.int32)
    if layout in ("self", "self_cut"):
        kw["cu_seqlens_k"] = kw["cu_seqlens_q"]
    if layout == "self_cut":
        used = [0 if z == 1 else (length if z == 0 else (length + 1) // 2) for z, length in enumerate(lq)]
        kw["seqused_q"] = kw["seqused_k"] = torch.tensor(used, dtype=torch.int32)
        lq = lk = used
    if layout == "padded_self":
        kw["seqused_k"] = kw["seqused_q"]
    kw["max_seqlen_q"], kw["max_seqlen_k"] = max(lq), max(lk)
    return VarlenCase(q, k, v, kw, lq, lk)


def _sample_rows(x, cu, z, length, dense_len):
    if cu is not None:
        return x[int(cu[z]):int(cu[z]) + length]
    return x[z if x.shape[0] > 1 else 0][:length if length is not None else dense_len]


def oracle(case: VarlenCase, activation="silu", scale=0.3, post_scale=0.7, causal=False, window=None,
           negative_slope=0.01):
    """(out, forward fn) in float64: per sample, heads repeated for GQA, mask by explicit index comparison."""
    kw = case.kwargs
    left, right = (window, window) if isinstance(window, int) else (window or (None, None))

    def forward(q, k, v, bias=None):
        """``bias`` broadcasts to [B, H, longest q, longest k] and is read at each sample's own positions."""
        outs = []
        if bias is not None:
            extent = [x.shape[1] if cu is None else max(lens)
                      for x, cu, lens in ((q, kw["cu_seqlens_q"], case.lq), (k, kw["cu_seqlens_k"], case.lk))]
            bias = bias.expand(len(case.lq), q.shape[-2], *extent)
        for z in range(len(case.lq)):
            qz = _sample_rows(q, kw["cu_seqlens_q"], z, case.lq[z], q.shape[1] if q.dim() == 4 else None)
            kz = _sample_rows(k, kw["cu_seqlens_k"], z, case.lk[z], k.shape[1] if k.dim() == 4 else None)
            vz = _sample_rows(v, kw["cu_seqlens_k"], z, case.lk[z], v.shape[1] if v.dim() == 4 else None)
            group = qz.shape[1] // kz.shape[1]
            qh = qz.transpose(0, 1)
            kh = kz.transpose(0, 1).repeat_interleave(group, 0)
            vh = vz.transpose(0, 1).repeat_interleave(group, 0)
            nq, nk = qh.shape[1], kh.shape[1]
            dev = q.device
            dpos = torch.arange(nk, device=dev)[None, :] - torch.arange(nq, device=dev)[:, None] - (nk - nq)
            keep = torch.ones(nq, nk, dtype=torch.bool, device=dev)
            if causal:
                keep &= dpos <= 0
            if left is not None and left >= 0:
                keep &= dpos >= -left
            if right is not None and right >= 0:
                keep &= dpos <= right
            s = qh @ kh.transpose(-2, -1) * scale
            if bias is not None:
                s = s + bias[z, :, :nq, :nk]
            p = EAGER_ACTIVATIONS[activation](s, negative_slope) * post_scale
            oz = (p.masked_fill(~keep, 0.0) @ vh).transpose(0, 1)
            rows = q.shape[1] if q.dim() == 4 else int(kw["cu_seqlens_q"][z + 1] - kw["cu_seqlens_q"][z])
            if rows != nq:  # rows past the sample's length (dense) or its rows used (jagged) are zeros
                full = oz.new_zeros(rows, *oz.shape[1:])
                full[:nq] = oz
                oz = full
            if q.dim() == 4:
                oz = oz[None]
            outs.append(oz)
        return torch.cat(outs)

    return forward


def bias_for(case: VarlenCase, gen, shared: bool, h=4) -> torch.Tensor:
    """A float64 bias for ``case``: [H, longest q, longest k] shared by the samples (a relative position bias)
    or [B, H, longest q, longest k], one per sample."""
    kw = case.kwargs
    nq = case.q.shape[1] if kw["cu_seqlens_q"] is None else kw["max_seqlen_q"]
    nk = case.k.shape[1] if kw["cu_seqlens_k"] is None else kw["max_seqlen_k"]
    shape = (h, nq, nk) if shared else (len(case.lq), h, nq, nk)
    return randn(gen, *shape, dtype=torch.float64) * 0.5
