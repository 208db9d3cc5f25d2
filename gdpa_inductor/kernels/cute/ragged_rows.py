"""Per-sample rows of a varlen batch, read and written by TMA (Triton's ragged TMA), shared by the CuTe forward and
backward.

The row mode of an operand is read per sample through one TMA descriptor whose bounds stop at the sample's end:
the mode has RAGGED_ROWS rows starting RAGGED_ROWS rows before the tensor, and an extra mode of the same stride,
indexed by the sample's end row, moves the window back. Row r of a sample (start s, length n) is at
(RAGGED_ROWS - n + r, s + n): past the sample's end the coordinate passes the bound, so loads read zeros there and
stores (and reduce-adds) are clipped, never touching the next sample's rows.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

RAGGED_ROWS = 2**30
RAGGED_ENDS = 2**31 - 1


def ragged(t: cute.Tensor, dim: int) -> cute.Tensor:
    """``t`` with its row mode ``dim`` bounded per sample: that mode RAGGED_ROWS long and shifted back by as many
    rows, plus a last mode of the same stride for the sample's end row."""
    shape = (*t.shape[:dim], RAGGED_ROWS, *t.shape[dim + 1:], RAGGED_ENDS)
    stride = (*t.stride, t.stride[dim])
    shift = (*(None,) * dim, -RAGGED_ROWS, *(None,) * (cute.rank(t) - dim - 1))
    return cute.make_tensor(cute.domain_offset(shift, t).iterator, cute.make_layout(shape, stride=stride))


@cute.jit
def sample_rows(m: cute.Tensor, h: cutlass.Int32, z: cutlass.Int32, start: cutlass.Int32, length: cutlass.Int32,
                row_mode: cutlass.Constexpr[int]):
    """The (rows, D) or (D, rows) (``row_mode``) tensor of head ``h``, sample ``z`` of a ``ragged`` operand: the
    sample's ``length`` rows from ``start`` (a side of one block, Z = 1, is read by every sample)."""
    rows = m[None, None, h, z % m.shape[3], start + length]
    shift = (RAGGED_ROWS - length, 0) if row_mode == 0 else (0, RAGGED_ROWS - length)
    return cute.domain_offset(shift, rows)
