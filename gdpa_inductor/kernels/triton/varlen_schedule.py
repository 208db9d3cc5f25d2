"""Each sample's rows on both sides, and the order the varlen kernels visit the samples in, in one launch.

For B samples, one Triton program reads the offsets (jagged side, with the rows used of each sample when it has
valid lengths too), the valid lengths (padded dense side) or nothing (full dense side), sorts the samples by work
(nq * nk, longest first) with ``tl.sort`` on keys that carry the sample index in their low bits, and writes, by
rank, the sample index with its start rows and lengths on both sides: a kernel program then loads its five scalars
at once, without a dependent load. The same with torch ops takes about six launches and a 28 us radix sort (H200),
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


@triton.jit
def _rows(Cu, Used, z, ok, N, MODE: tl.constexpr):
    if MODE == 0:
        start = tl.load(Cu + z, mask=ok, other=0).to(tl.int32)
        length = tl.load(Cu + z + 1, mask=ok, other=0).to(tl.int32) - start
    elif MODE == 1:
        start = tl.zeros_like(z)
        length = tl.load(Used + z, mask=ok, other=0).to(tl.int32)
    elif MODE == 3:
        start = tl.load(Cu + z, mask=ok, other=0).to(tl.int32)
        length = tl.load(Cu + z + 1, mask=ok, other=0).to(tl.int32) - start
        length = tl.minimum(length, tl.maximum(tl.load(Used + z, mask=ok, other=0).to(tl.int32), 0))
    else:
        start = tl.zeros_like(z)
        length = tl.zeros_like(z) + N
    return start, length


@triton.jit
def varlen_schedule_kernel(
    CuQ, UsedQ, CuK, UsedK, StartQ, LenQ, StartK, LenK, Order, B, NQ, NK,
    Q_MODE: tl.constexpr, K_MODE: tl.constexpr, INDEX_BITS: tl.constexpr, BLOCK: tl.constexpr,
):
    z = tl.arange(0, BLOCK)
    ok = z < B
    _, lq = _rows(CuQ, UsedQ, z, ok, NQ, Q_MODE)
    _, lk = _rows(CuK, UsedK, z, ok, NK, K_MODE)
    work = lq.to(tl.int64) * lk.to(tl.int64)
    # Descending keys: more work first; equal work in index order (the low bits hold BLOCK - 1 - z).
    key = tl.where(ok, (work << INDEX_BITS) | (BLOCK - 1 - z).to(tl.int64), -1)
    ranked = tl.sort(key, descending=True)
    order = (BLOCK - 1 - (ranked & ((1 << INDEX_BITS) - 1))).to(tl.int32)
    # Rows in rank order, read again at the sorted indices (no round trip through memory).
    sq, lq = _rows(CuQ, UsedQ, order, ok, NQ, Q_MODE)
    sk, lk = _rows(CuK, UsedK, order, ok, NK, K_MODE)
    tl.store(Order + z, order, mask=ok)
    tl.store(StartQ + z, sq, mask=ok)
    tl.store(LenQ + z, lq, mask=ok)
    tl.store(StartK + z, sk, mask=ok)
    tl.store(LenK + z, lk, mask=ok)


@triton.jit
def program_work(MAX_N, BLOCK: tl.constexpr, HEADS, Order, StartQ, LenQ, StartK, LenK):
    """What program ``program_id(0)`` of a varlen kernel does: (tile index, head, sample, nq, nk, first
    query row, first key row). Tiles of one (sample, head) are adjacent, samples in the schedule's rank
    order; the five per-sample loads are independent of each other (rank-ordered rows)."""
    num_tiles = tl.cdiv(MAX_N, BLOCK)
    pid = tl.program_id(0)
    rest = pid // num_tiles
    rank = rest // HEADS
    z = tl.load(Order + rank).to(tl.int64)
    nq = tl.load(LenQ + rank)
    nk = tl.load(LenK + rank)
    q_row0 = tl.load(StartQ + rank).to(tl.int64)
    k_row0 = tl.load(StartK + rank).to(tl.int64)
    return pid % num_tiles, rest % HEADS, z, nq, nk, q_row0, k_row0


def _mode(cu, used) -> int:
    if cu is not None:
        return _JAGGED if used is None else _JAGGED_USED
    return _PADDED if used is not None else _FULL


def _torch_rows(x, cu, used, batch):
    if cu is not None:
        cu = cu.to(torch.int32)
        lengths = cu[1:] - cu[:-1]
        if used is not None:
            lengths = torch.minimum(lengths, used.to(torch.int32).clamp_min(0))
        return cu[:-1], lengths
    starts = torch.zeros(batch, dtype=torch.int32, device=x.device)
    if used is not None:
        return starts, used.to(torch.int32)
    return starts, torch.full((batch,), x.shape[1], dtype=torch.int32, device=x.device)


def varlen_sides(q, k, cu_q, cu_k, used_q, used_k, max_q: int, max_k: int, batch: int,
                 traced: bool = False) -> tuple[VarlenSide, VarlenSide, torch.Tensor]:
    """(query side, key side, sample order) for the varlen kernels; ``max_*`` count only for jagged sides
    (a dense side's length is its N). ``traced``: the launch goes into a compiled graph (``layout.launcher``)."""
    nq = max_q if cu_q is not None else q.shape[1]
    nk = max_k if cu_k is not None else k.shape[1]
    on_kernel = (q.device.type == "cuda" or interpreting()) and 0 < batch <= MAX_SORT
    if on_kernel:
        # five tensors, not views of one: a traced launch may write only whole tensors
        sq, lq, sk, lk, order = (torch.empty(batch, dtype=torch.int32, device=q.device) for _ in range(5))
        dummy = torch.empty(1, dtype=torch.int32, device=q.device)  # stands for the offsets a side does not have
        launcher(varlen_schedule_kernel, traced)[(1,)](
            cu_q if cu_q is not None else dummy, used_q if used_q is not None else dummy,
            cu_k if cu_k is not None else dummy, used_k if used_k is not None else dummy,
            sq, lq, sk, lk, order, batch, q.shape[1] if cu_q is None else 0, k.shape[1] if cu_k is None else 0,
            Q_MODE=_mode(cu_q, used_q), K_MODE=_mode(cu_k, used_k), INDEX_BITS=_INDEX_BITS,
            BLOCK=triton.next_power_of_2(batch),
            # the single program's sort: 20 vs 29 us with 16 warps vs 4 at B=1152 (H200)
            num_warps=16 if batch >= 1024 else 4,
        )
    else:
        sq, lq = _torch_rows(q, cu_q, used_q, batch)
        sk, lk = _torch_rows(k, cu_k, used_k, batch)
        work = lq.to(torch.int64) * lk.to(torch.int64)
        order = torch.sort(work, descending=True, stable=True).indices
        sq, lq, sk, lk = (x[order] for x in (sq, lq, sk, lk))
        order = order.to(torch.int32)
    qs = VarlenSide(q, sq, lq, nq, batch, cu_q is not None)
    ks = VarlenSide(k, sk, lk, nk, batch, cu_k is not None)
    return qs, ks, order
