"""Each sample's rows on both sides, and the order the varlen kernels visit the samples in, in one launch.

For B samples, one Triton program reads the offsets (jagged side, with the rows used of each sample when it has
valid lengths too), the valid lengths (padded dense side) or nothing (full dense side), sorts the samples by work
(nq * nk, longest first) with ``tl.sort`` on keys that carry the sample index in their low bits, and writes, by
rank, the sample index with its start rows and lengths on both sides, into one int32 ``[SCHEDULE_ROWS, B]``
tensor: a kernel program then loads its five scalars at once, without a dependent load. For a jagged side it also
writes where the unread rows after each sample stop (``GAP_END_*``), so that a backward zeroes only those rows of
its gradients (``varlen_gaps.py``). The same with torch ops takes about six launches and a 28 us radix sort (H200),
10% of a forward at Meta's shortest shapes. Batches beyond one program's sort (``MAX_SORT``), and CPU tensors
outside the interpreter, use the torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.varlen_rows import VarlenSide
from .layout import interpreting, launcher

MAX_SORT = 8192
_INDEX_BITS = 24
_JAGGED, _PADDED, _FULL, _JAGGED_USED = 0, 1, 2, 3

# The schedule's rows, each [B] by rank. A gap end is the row where the unread rows after the sample stop (the next
# sample's first row, or the side's rows after the last sample); -1 on every rank of a side whose offsets decrease.
START_Q, LEN_Q, START_K, LEN_K, ORDER, GAP_END_Q, GAP_END_K = (tl.constexpr(row) for row in range(7))
SCHEDULE_ROWS = 7


@triton.jit
def _rows(Cu, Used, z, ok, N, ROWS, MODE: tl.constexpr):
    # offsets clamped to the side's rows and lengths cut to [0, N]: whatever the offsets, no row outside is read
    if MODE == 1:
        start = tl.zeros_like(z)
        length = tl.minimum(tl.maximum(tl.load(Used + z, mask=ok, other=0).to(tl.int64), 0), N).to(tl.int32)
    elif MODE == 2:
        start = tl.zeros_like(z)
        length = tl.zeros_like(z) + N
    else:
        first = tl.minimum(tl.maximum(tl.load(Cu + z, mask=ok, other=0).to(tl.int64), 0), ROWS)
        end = tl.minimum(tl.maximum(tl.load(Cu + z + 1, mask=ok, other=0).to(tl.int64), 0), ROWS)
        length = tl.minimum(tl.maximum(end - first, 0), N)
        if MODE == 3:
            length = tl.minimum(length, tl.maximum(tl.load(Used + z, mask=ok, other=0).to(tl.int64), 0))
        start = first.to(tl.int32)
        length = length.to(tl.int32)
    return start, length


@triton.jit
def _gap_ends(Cu, z, ok, B, ROWS, MODE: tl.constexpr):
    """Per lane: where the unread rows after sample ``z`` end; -1 on every lane where the clamped offsets decrease
    anywhere (the lanes hold every sample, in any order)."""
    if MODE == 0 or MODE == 3:
        first = tl.minimum(tl.maximum(tl.load(Cu + z, mask=ok, other=0).to(tl.int64), 0), ROWS)
        end = tl.minimum(tl.maximum(tl.load(Cu + z + 1, mask=ok, other=0).to(tl.int64), 0), ROWS)
        decreasing = tl.sum(tl.where(ok & (end < first), 1, 0), axis=0) > 0
        gap_end = tl.where(z == B - 1, ROWS, end)
        return tl.where(decreasing, -1, gap_end).to(tl.int32)
    else:
        return tl.zeros_like(z)


@triton.jit
def varlen_schedule_kernel(
    CuQ, UsedQ, CuK, UsedK, Sched, B, NQ, NK, ROWS_Q, ROWS_K,
    Q_MODE: tl.constexpr, K_MODE: tl.constexpr, INDEX_BITS: tl.constexpr, BLOCK: tl.constexpr,
):
    z = tl.arange(0, BLOCK)
    ok = z < B
    _, lq = _rows(CuQ, UsedQ, z, ok, NQ, ROWS_Q, Q_MODE)
    _, lk = _rows(CuK, UsedK, z, ok, NK, ROWS_K, K_MODE)
    work = lq.to(tl.int64) * lk.to(tl.int64)
    # Descending keys: more work first; equal work in index order (the low bits hold BLOCK - 1 - z).
    key = tl.where(ok, (work << INDEX_BITS) | (BLOCK - 1 - z).to(tl.int64), -1)
    ranked = tl.sort(key, descending=True)
    order = (BLOCK - 1 - (ranked & ((1 << INDEX_BITS) - 1))).to(tl.int32)
    # Rows in rank order, read again at the sorted indices (no round trip through memory).
    sq, lq = _rows(CuQ, UsedQ, order, ok, NQ, ROWS_Q, Q_MODE)
    sk, lk = _rows(CuK, UsedK, order, ok, NK, ROWS_K, K_MODE)
    gq = _gap_ends(CuQ, order, ok, B, ROWS_Q, Q_MODE)
    gk = _gap_ends(CuK, order, ok, B, ROWS_K, K_MODE)
    tl.store(Sched + START_Q * B + z, sq, mask=ok)
    tl.store(Sched + LEN_Q * B + z, lq, mask=ok)
    tl.store(Sched + START_K * B + z, sk, mask=ok)
    tl.store(Sched + LEN_K * B + z, lk, mask=ok)
    tl.store(Sched + ORDER * B + z, order, mask=ok)
    tl.store(Sched + GAP_END_Q * B + z, gq, mask=ok)
    tl.store(Sched + GAP_END_K * B + z, gk, mask=ok)


@triton.jit
def program_work(MAX_N, BLOCK: tl.constexpr, HEADS):
    """What program ``program_id(0)`` of a varlen kernel does: (tile index, head, rank of its sample). Tiles of one
    (sample, head) are adjacent, samples in the schedule's rank order. The kernel then loads the sample's index,
    lengths and first rows at that rank itself (five independent loads): a helper taking the schedule's pointer
    would read, to Inductor's analysis of a compiled graph's launches, as writing it, and cost a copy."""
    num_tiles = tl.cdiv(MAX_N, BLOCK)
    pid = tl.program_id(0)
    rest = pid // num_tiles
    return pid % num_tiles, rest % HEADS, rest // HEADS


def _mode(cu, used) -> int:
    if cu is not None:
        return _JAGGED if used is None else _JAGGED_USED
    return _PADDED if used is not None else _FULL


def _torch_rows(x, cu, used, batch, n):
    """(starts, lengths, gap ends) as the kernel's ``_rows`` and ``_gap_ends`` give them, in sample order."""
    if cu is not None:
        rows = x.shape[0]
        cu = cu.to(torch.int64).clamp(0, rows)
        lengths = (cu[1:] - cu[:-1]).clamp(0, n)
        if used is not None:
            lengths = torch.minimum(lengths, used.to(torch.int64).clamp_min(0))
        last = torch.arange(batch, device=cu.device) == batch - 1
        gap_ends = torch.where((cu[1:] < cu[:-1]).any(), -1, torch.where(last, rows, cu[1:]))
        return cu[:-1].to(torch.int32), lengths.to(torch.int32), gap_ends.to(torch.int32)
    starts = torch.zeros(batch, dtype=torch.int32, device=x.device)
    if used is not None:
        return starts, used.to(torch.int64).clamp(0, n).to(torch.int32), starts
    return starts, torch.full((batch,), n, dtype=torch.int32, device=x.device), starts


def varlen_sides(q, k, cu_q, cu_k, used_q, used_k, max_q: int, max_k: int, batch: int,
                 traced: bool = False) -> tuple[VarlenSide, VarlenSide, torch.Tensor]:
    """(query side, key side, schedule) for the varlen kernels: the schedule is the int32 ``[SCHEDULE_ROWS, B]``
    tensor the sides' starts and lengths are rows of. ``max_*`` count only for jagged sides (a dense side's length
    is its N). A jagged side's offsets (any integer dtype) are clamped to its rows, and every length is cut to
    [0, its side's longest]. ``traced``: the launch goes into a compiled graph (``layout.launcher``)."""
    nq, nk = _longest(q, cu_q, max_q), _longest(k, cu_k, max_k)
    on_kernel = (q.device.type == "cuda" or interpreting()) and 0 < batch <= MAX_SORT
    if on_kernel:
        schedule = torch.empty(SCHEDULE_ROWS, batch, dtype=torch.int32, device=q.device)
        # a side without offsets or lengths passes a tensor it has, which its mode never reads
        launcher(varlen_schedule_kernel, traced)[(1,)](
            _given(cu_q, used_q, q), _given(used_q, cu_q, q), _given(cu_k, used_k, k), _given(used_k, cu_k, k),
            schedule, batch, nq, nk, q.shape[0], k.shape[0],
            Q_MODE=_mode(cu_q, used_q), K_MODE=_mode(cu_k, used_k), INDEX_BITS=_INDEX_BITS,
            BLOCK=triton.next_power_of_2(batch),
            # the single program's sort: 20 vs 29 us with 16 warps vs 4 at B=1152 (H200)
            num_warps=16 if batch >= 1024 else 4,
        )
    else:
        sq, lq, gq = _torch_rows(q, cu_q, used_q, batch, nq)
        sk, lk, gk = _torch_rows(k, cu_k, used_k, batch, nk)
        work = lq.to(torch.int64) * lk.to(torch.int64)
        order = torch.sort(work, descending=True, stable=True).indices
        ranked = [x[order] for x in (sq, lq, sk, lk)] + [order.to(torch.int32)] + [x[order] for x in (gq, gk)]
        schedule = torch.stack(ranked)
    return (*scheduled_sides(q, k, cu_q, cu_k, max_q, max_k, batch, schedule), schedule)


def _given(first, second, last):
    return next(x for x in (first, second, last) if x is not None)


def scheduled_sides(q, k, cu_q, cu_k, max_q: int, max_k: int, batch: int,
                    schedule: torch.Tensor) -> tuple[VarlenSide, VarlenSide]:
    """(query side, key side) over a schedule ``varlen_sides`` made: a backward reuses its forward's."""
    return (VarlenSide(q, row(schedule, START_Q), row(schedule, LEN_Q), _longest(q, cu_q, max_q), batch,
                       cu_q is not None),
            VarlenSide(k, row(schedule, START_K), row(schedule, LEN_K), _longest(k, cu_k, max_k), batch,
                       cu_k is not None))


def row(schedule: torch.Tensor, which: tl.constexpr) -> torch.Tensor:
    """One of a schedule's rows (``START_Q`` ... ``GAP_END_K``), by rank."""
    return schedule[which.value]


def _longest(x, cu, max_len: int) -> int:
    return max_len if cu is not None else x.shape[1]
