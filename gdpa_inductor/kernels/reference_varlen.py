"""Pure-PyTorch varlen GDPA: the dense reference (``reference.py``) applied to each sample's rows.

Layouts (FlashAttention's): a jagged side is ``[total, H, D]`` with offsets ``cu_seqlens`` of length B + 1
(int32 from the public API; the backend's rewrite passes the graph's own integer offsets), clamped to the rows, each
sample's length cut to ``max_seqlen``; a dense side (``cu_seqlens`` None) is ``[B or 1, N, H, D]``, a batch of 1
being shared by every sample (PMA's seed queries, a shared memory), optionally with per-sample valid lengths
``seqused`` (a padded batch: rows past the length take no part and get zeros; on a jagged side, the first
``seqused`` rows of each sample take part, the rest likewise). The output follows the query's layout.
An optional additive ``bias`` broadcasts to ``[B, H, max_seqlen_q, max_seqlen_k]`` and is indexed by the
sample and the positions within it (a padded batch's own coordinates): sample z reads
``bias[z, :, :n_q(z), :n_k(z)]``; max_seqlen is a dense side's N.
Reads the offsets on the host: this is the CPU path and the tests' oracle, not a fast path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference import gdpa_reference, gdpa_reference_backward


def varlen_batch(q, k, cu_seqlens_q, cu_seqlens_k) -> int:
    if cu_seqlens_q is not None:
        return cu_seqlens_q.numel() - 1
    if cu_seqlens_k is not None:
        return cu_seqlens_k.numel() - 1
    return max(q.shape[0], k.shape[0])


def varlen_out_shape(q, v, cu_seqlens_q, batch: int) -> tuple[int, ...]:
    if cu_seqlens_q is not None:
        return (q.shape[0], q.shape[1], v.shape[-1])
    return (batch, q.shape[1], q.shape[2], v.shape[-1])


@dataclass(frozen=True)
class _Rows:
    """Where each sample's rows are in one side's tensors: offsets clamped to the rows, lengths cut to [0, the side's
    longest], as the kernels' schedule reads them."""

    offsets: list[int] | None  # jagged
    used: list[int] | None  # rows that take part: a padded dense side's, or a jagged side's first ones
    longest: int

    @staticmethod
    def of(x: torch.Tensor, cu: torch.Tensor | None, seqused: torch.Tensor | None, max_seqlen: int) -> "_Rows":
        offsets = None if cu is None else cu.to(torch.int64).clamp(0, x.shape[0]).tolist()
        longest = max_seqlen if cu is not None else x.shape[1]
        return _Rows(offsets, None if seqused is None else seqused.clamp_min(0).tolist(), longest)

    def index(self, x: torch.Tensor, z: int) -> tuple:
        if self.offsets is not None:
            start = self.offsets[z]
            end = min(self.offsets[z + 1], start + self.longest)
            if self.used is not None:
                end = min(end, start + self.used[z])
            return (slice(start, max(start, end)),)
        entry = z if x.shape[0] > 1 else 0
        return (entry, slice(0, min(self.used[z], self.longest) if self.used is not None else x.shape[1]))

    def heads_first(self, x: torch.Tensor, z: int) -> torch.Tensor:
        return x[self.index(x, z)].transpose(0, 1)


def bias_shape(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
               batch: int) -> tuple[int, int, int, int]:
    """What a varlen bias broadcasts to: [B, H, longest query, longest key] (a dense side's N)."""
    return (batch, q.shape[-2], max_seqlen_q if cu_seqlens_q is not None else q.shape[1],
            max_seqlen_k if cu_seqlens_k is not None else k.shape[1])


def _sample_bias(bias4: torch.Tensor | None, z: int, nq: int, nk: int) -> torch.Tensor | None:
    return None if bias4 is None else bias4[z, :, :nq, :nk]


def gdpa_varlen_reference(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                          max_seqlen_k, activation, scale, post_scale, causal, window, negative_slope) -> torch.Tensor:
    batch = varlen_batch(q, k, cu_seqlens_q, cu_seqlens_k)
    rq, rk = _Rows.of(q, cu_seqlens_q, seqused_q, max_seqlen_q), _Rows.of(k, cu_seqlens_k, seqused_k, max_seqlen_k)
    out = v.new_zeros(varlen_out_shape(q, v, cu_seqlens_q, batch))
    full = bias_shape(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, batch)
    bias4 = None if bias is None else bias.expand(full)
    for z in range(batch):
        qz, kz, vz = rq.heads_first(q, z), rk.heads_first(k, z), rk.heads_first(v, z)
        if qz.shape[-2] and kz.shape[-2]:
            bz = _sample_bias(bias4, z, qz.shape[-2], kz.shape[-2])
            oz = gdpa_reference(qz, kz, vz, bz, activation, scale, post_scale, causal, negative_slope,
                                window=window)
            out[rq.index(out, z) if cu_seqlens_q is not None else (z, rq.index(q, z)[1])] = oz.transpose(0, 1)
    return out


def gdpa_varlen_reference_backward(dout, q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                                   max_seqlen_q, max_seqlen_k, activation, scale, post_scale, causal, window,
                                   negative_slope, bias_requires_grad) -> tuple:
    """(dq, dk, dv, dbias or None) in the inputs' shapes and dtypes; a dense side shared by the batch, and a
    bias broadcast over samples or heads, sum their samples."""
    batch = varlen_batch(q, k, cu_seqlens_q, cu_seqlens_k)
    rq, rk = _Rows.of(q, cu_seqlens_q, seqused_q, max_seqlen_q), _Rows.of(k, cu_seqlens_k, seqused_k, max_seqlen_k)
    acc = torch.promote_types(q.dtype, torch.float32)
    dq, dk, dv = (torch.zeros(x.shape, dtype=acc, device=x.device) for x in (q, k, v))
    full = bias_shape(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, batch)
    bias4 = None if bias is None else bias.expand(full)
    want_db = bias is not None and bias_requires_grad
    db4 = torch.zeros(full, dtype=acc, device=q.device) if want_db else None
    for z in range(batch):
        qz, kz, vz = rq.heads_first(q, z), rk.heads_first(k, z), rk.heads_first(v, z)
        if not (qz.shape[-2] and kz.shape[-2]):
            continue
        do_index = rq.index(dout, z) if cu_seqlens_q is not None else (z, rq.index(q, z)[1])
        nq, nk = qz.shape[-2], kz.shape[-2]
        gq, gk, gv, gb = gdpa_reference_backward(dout[do_index].transpose(0, 1), qz, kz, vz,
                                                 _sample_bias(bias4, z, nq, nk), activation, scale, post_scale,
                                                 causal, negative_slope, want_db, window=window)
        dq[rq.index(q, z)] += gq.transpose(0, 1).to(acc)
        dk[rk.index(k, z)] += gk.transpose(0, 1).to(acc)
        dv[rk.index(v, z)] += gv.transpose(0, 1).to(acc)
        if want_db:
            db4[z, :, :nq, :nk] = gb.to(acc)
    dbias = db4.sum_to_size(bias.shape).to(bias.dtype) if want_db else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias
