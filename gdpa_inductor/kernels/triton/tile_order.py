"""Which tiles a dense kernel's program takes: its query tile, sample and heads in the 1-D grid, and the key tiles
the causal mask keeps (shared by the dense forward, its TMA variant and the backward)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def query_tile_program(NQ, H, GROUP, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """(query tile, sample, head, kv head) of this program in the dense kernels' 1-D grid: query tiles
    fastest so neighbouring programs share K/V in L2; with causal masking the longest rows (last tiles)
    go first."""
    num_m = tl.cdiv(NQ, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % num_m
    if CAUSAL:
        pid_m = num_m - 1 - pid_m
    zh = pid // num_m
    h = zh % H
    return pid_m, (zh // H).to(tl.int64), h, h // GROUP


@triton.jit
def causal_key_tiles(pid_m, NQ, NK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(end of the key tiles every query of the tile keeps, end of the keys any of them keeps): key j is kept
    for query i iff j <= i + NK - NQ."""
    if CAUSAL:
        hi = tl.minimum(NK, (pid_m + 1) * BLOCK_M + NK - NQ)
        full = tl.minimum(pid_m * BLOCK_M + NK - NQ + 1, NK)
    else:
        hi = NK
        full = NK
    return tl.maximum(full, 0) // BLOCK_N * BLOCK_N, hi
