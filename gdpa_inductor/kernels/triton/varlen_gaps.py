"""The rows of a jagged side's gradients that no sample writes, zeroed in one launch before the backward's kernels.

The dK/dV and dQ kernels write every row of every sample (a sample's rows, cut to the side's longest). A jagged
side's rows outside all samples (before the first, after a sample cut short, after the last) must read as zero, as
eager's gradient of a gather gives them. Zero-filling whole buffers first costs a write of each; here each program
zeroes the unread rows after one sample (``GAP_END_*`` of the schedule), and the first sample's program the rows
before it too. Where a side's offsets decrease somewhere (samples may then overlap), its programs zero all its rows
instead, which the kernels then overwrite where samples write.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import launcher
from .varlen_schedule import GAP_END_K, GAP_END_Q, LEN_K, LEN_Q, ORDER, START_K, START_Q

_BLOCK = 1024


@triton.jit
def _zero(Ptr, lo, hi, BLOCK: tl.constexpr):
    for off in range(lo, hi, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        tl.store(Ptr + offs, tl.zeros([BLOCK], dtype=Ptr.dtype.element_ty), mask=offs < hi)


@triton.jit(do_not_specialize=["B", "ROWS_Q", "ROWS_K", "WIDTH_Q", "WIDTH_K", "WIDTH_V"])
def varlen_zero_gaps_kernel(
    Sched, B, DQ, DK, DV_, ROWS_Q, ROWS_K, WIDTH_Q, WIDTH_K, WIDTH_V,
    Q_JAGGED: tl.constexpr, K_JAGGED: tl.constexpr, BLOCK: tl.constexpr,
):
    # each side's loads written out: a helper taking Sched would read, to Inductor, as writing it (program_work)
    rank = tl.program_id(0)
    first = tl.load(Sched + ORDER * B + rank) == 0
    if Q_JAGGED:
        start = tl.load(Sched + START_Q * B + rank).to(tl.int64)
        end = start + tl.load(Sched + LEN_Q * B + rank)
        gap_end = tl.load(Sched + GAP_END_Q * B + rank).to(tl.int64)
        lo, hi, lead = _gap(start, end, gap_end, first, rank, B, ROWS_Q)
        _zero(DQ, lo * WIDTH_Q, hi * WIDTH_Q, BLOCK)
        _zero(DQ, 0, lead * WIDTH_Q, BLOCK)
    if K_JAGGED:
        start = tl.load(Sched + START_K * B + rank).to(tl.int64)
        end = start + tl.load(Sched + LEN_K * B + rank)
        gap_end = tl.load(Sched + GAP_END_K * B + rank).to(tl.int64)
        lo, hi, lead = _gap(start, end, gap_end, first, rank, B, ROWS_K)
        _zero(DK, lo * WIDTH_K, hi * WIDTH_K, BLOCK)
        _zero(DK, 0, lead * WIDTH_K, BLOCK)
        _zero(DV_, lo * WIDTH_V, hi * WIDTH_V, BLOCK)
        _zero(DV_, 0, lead * WIDTH_V, BLOCK)


@triton.jit
def _gap(start, end, gap_end, first, rank, B, ROWS):
    """(rows lo..hi to zero, rows before the first sample to zero): the rows after this sample's end up to its gap
    end; where the side's offsets decrease (gap end -1), this program's share of all rows."""
    if gap_end < 0:
        lo = rank.to(tl.int64) * ROWS // B
        hi = (rank.to(tl.int64) + 1) * ROWS // B
        lead = tl.zeros_like(lo)
    else:
        lo = end
        hi = gap_end
        lead = tl.where(first, start, 0)
    return lo, hi, lead


def zero_gaps(schedule: torch.Tensor, batch: int, dq: torch.Tensor | None, dk: torch.Tensor | None,
              dv: torch.Tensor | None, traced: bool) -> None:
    """Zeroes the rows no sample writes of the jagged sides' contiguous gradients (``dq`` for the queries, ``dk``
    and ``dv`` for the keys; None where a side is not jagged)."""
    if batch == 0 or (dq is None and dk is None):
        return
    q_rows, q_width = (dq.shape[0], dq[0].numel()) if dq is not None and dq.shape[0] else (0, 0)
    k_rows, k_width = (dk.shape[0], dk[0].numel()) if dk is not None and dk.shape[0] else (0, 0)
    v_width = dv[0].numel() if dv is not None and dv.shape[0] else 0
    # a side that is not jagged passes the schedule, which its branch never touches (not a gradient: a tensor
    # passed twice, once written, would be copied in a compiled graph)
    launcher(varlen_zero_gaps_kernel, traced)[(batch,)](
        schedule, batch, dq if dq is not None else schedule, dk if dk is not None else schedule,
        dv if dv is not None else schedule, q_rows, k_rows, q_width, k_width, v_width,
        Q_JAGGED=dq is not None, K_JAGGED=dk is not None, BLOCK=_BLOCK, num_warps=4,
    )
