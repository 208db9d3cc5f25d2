"""dQ from the fp32 sums the CuTe backward leaves in its accumulators' order (80-row query tiles, ``GdpaBwdSm90``'s
``dq_flat``): permuted into rows of D, scaled and rounded once, in one pass.

A torch permute of that buffer (``cute.bwd_results.dq_fragments_as_rows``) reads it 64 bytes apart along its
fastest output dim: 1.6 ms against the plain cast's 0.6 ms at 2048², B = 288, H = 4 (H200). Here each program reads a
tile's 512-value blocks in order (one warpgroup's eight query columns of its 64 rows of dQᵀ), permutes them in registers
and shared memory, and stores eight rows of 64 values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# A warpgroup's wgmma accumulator (PTX ISA, "wgmma .m64nNk16 register fragment D"): thread 32 w + 4 g + t holds rows
# 16 w + 8 r + g and columns 8 j + 2 t + c as its value c + 2 r + 4 j (r, c in {0, 1}); the kernel stores its values
# four at a time (one j), a j's 128 threads in a row, so a j's block holds (w, g, t, r, c) of 4 x 8 x 4 x 2 x 2
ACC_WARPS, ACC_ROW_GROUPS, ACC_COL_PAIRS = 4, 8, 4
ACC_COLUMNS_PER_J = 2 * ACC_COL_PAIRS
ACC_ROWS = ACC_WARPS * 2 * ACC_ROW_GROUPS
J_BLOCK = ACC_ROWS * ACC_COLUMNS_PER_J


@triton.jit
def _dq_of_fragments_kernel(
    src, dst, factor, num_queries, num_heads, num_tiles,
    stride_dz, stride_dh, stride_dq,
    TILE: tl.constexpr, HALVES: tl.constexpr, WARPS: tl.constexpr, GROUPS: tl.constexpr, PAIRS: tl.constexpr,
):
    pid = tl.program_id(0)
    tile = pid % num_tiles
    z = pid // num_tiles // num_heads
    h = pid // num_tiles % num_heads
    cols_per_j: tl.constexpr = 2 * PAIRS
    rows: tl.constexpr = WARPS * 2 * GROUPS
    block: tl.constexpr = rows * cols_per_j
    js: tl.constexpr = TILE // cols_per_j
    base = src + pid.to(tl.int64) * (HALVES * js * block)
    out = dst + z.to(tl.int64) * stride_dz + h.to(tl.int64) * stride_dh
    offs = tl.arange(0, block)
    for half in tl.static_range(HALVES):
        for j in tl.static_range(js):
            x = tl.load(base + (half * js + j) * block + offs)
            x = tl.reshape(x, (WARPS, GROUPS, PAIRS, 2, 2))
            # (w, g, t, r, c) -> (t, c | w, r, g): column 2 t + c of the j's eight, row 16 w + 8 r + g of the half
            x = tl.reshape(tl.permute(x, (2, 4, 0, 3, 1)), (cols_per_j, rows))
            q = tile * TILE + j * cols_per_j + tl.arange(0, cols_per_j)
            d = half * rows + tl.arange(0, rows)
            tl.store(out + q[:, None].to(tl.int64) * stride_dq + d[None, :], (x * factor).to(dst.dtype.element_ty),
                     mask=q[:, None] < num_queries)


def dq_of_fragments_triton(sums: torch.Tensor, out: torch.Tensor, factor: float, query_tile: int) -> torch.Tensor:
    """``out`` [Z, H, Nq, D] (D contiguous) = ``factor`` x the dQ that ``sums`` ([Z, H, rows, D] fp32, contiguous,
    rows a whole number of ``query_tile``-row tiles) holds in the accumulators' order."""
    z, h, rows, d = sums.shape
    tiles = rows // query_tile
    _dq_of_fragments_kernel[(z * h * tiles,)](
        sums, out, factor, out.shape[2], h, tiles, out.stride(0), out.stride(1), out.stride(2),
        TILE=query_tile, HALVES=d // ACC_ROWS, WARPS=ACC_WARPS, GROUPS=ACC_ROW_GROUPS, PAIRS=ACC_COL_PAIRS,
        num_warps=4,
    )
    return out
