"""Per-sample rows of a varlen call, as the varlen kernels of both backends read them.

A side (queries, or keys with values) is a tensor plus, for each of the B samples, the row its sample
starts at and its length (built by ``triton/varlen_schedule.py``). Jagged ``[total, H, D]`` tensors take both from
``cu_seqlens``; dense ``[B or 1, N, H, D]`` tensors start every sample at row 0 of its own batch entry (a
batch of 1 is shared: stride 0) and take N, or a padded batch's valid lengths, as the length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VarlenSide:
    tensor: torch.Tensor
    starts: torch.Tensor  # int32 [B], in the schedule's rank order (varlen_schedule)
    lengths: torch.Tensor  # int32 [B], in the same order
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


def with_tensor(side: VarlenSide, x: torch.Tensor) -> VarlenSide:
    """The same rows over another tensor of the same layout (an output or a gradient)."""
    return VarlenSide(x, side.starts, side.lengths, side.max_len, side.batch, side.jagged)
