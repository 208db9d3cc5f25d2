"""Per-sample rows of a varlen call, as the varlen kernels read them.

A side (queries, or keys with values) is a tensor plus, for each of the B samples, the row its sample
starts at and its length. Jagged ``[total, H, D]`` tensors take both from ``cu_seqlens``; dense
``[B or 1, N, H, D]`` tensors start every sample at row 0 of its own batch entry (a batch of 1 is shared:
stride 0) and take N, or a padded batch's valid lengths, as the length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VarlenSide:
    tensor: torch.Tensor
    starts: torch.Tensor  # int32 [B]
    lengths: torch.Tensor  # int32 [B]
    max_len: int
    batch: int
    jagged: bool

    def strides_of(self, x: torch.Tensor) -> tuple[int, int, int, int]:
        """(per-sample, row, head, dim) strides of ``x``, laid out like this side's tensor."""
        if self.jagged:
            return 0, *x.stride()
        return (x.stride(0) if x.shape[0] > 1 else 0), *x.stride()[1:]

    def strides(self) -> tuple[int, int, int, int]:
        return self.strides_of(self.tensor)


def jagged_side(x: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int) -> VarlenSide:
    cu = cu_seqlens.to(torch.int32)
    return VarlenSide(x, cu[:-1], cu[1:] - cu[:-1], int(max_len), cu.numel() - 1, True)


def dense_side(x: torch.Tensor, batch: int, lengths: torch.Tensor | None = None) -> VarlenSide:
    n = x.shape[1]
    if lengths is None:
        lengths = torch.full((batch,), n, dtype=torch.int32, device=x.device)
    starts = torch.zeros(batch, dtype=torch.int32, device=x.device)
    return VarlenSide(x, starts, lengths.to(torch.int32), n, batch, False)


def with_tensor(side: VarlenSide, x: torch.Tensor) -> VarlenSide:
    """The same rows over another tensor of the same layout (an output or a gradient)."""
    return VarlenSide(x, side.starts, side.lengths, side.max_len, side.batch, side.jagged)


def longest_first(q_lengths: torch.Tensor, k_lengths: torch.Tensor) -> torch.Tensor:
    """Samples by decreasing work (nq * nk), on the device (no host sync): the kernels' launch order."""
    work = q_lengths.to(torch.int64) * k_lengths.to(torch.int64)
    return torch.argsort(work, descending=True).to(torch.int32)
