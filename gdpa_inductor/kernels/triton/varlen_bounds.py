"""Which tiles a varlen program visits, and which of them need masks.

A key j is kept for query i of a sample with lengths (nq, nk) iff ``d = j - i - (nk - nq)`` satisfies
``-LEFT <= d <= RIGHT`` (causal: RIGHT = 0; no window: the bound is ``UNBOUNDED``; both from
``common/window_bounds.py``), and both are inside the sample. Tiles that straddle a bound run masked; tiles fully
inside run without masks; tiles fully outside are never visited, so a window or a short sample costs only the work
it has.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _span(a0, a_last, off, LEFT, RIGHT, n_other, BLOCK: tl.constexpr):
    """For rows a0..a_last along one axis and the other axis of length n_other, where the other index b
    must satisfy ``a + off - LEFT <= b <= a + off + RIGHT``: (lo, full_lo, full_hi, hi), BLOCK-aligned from
    lo, with [lo, full_lo) and [full_hi, hi) masked and [full_lo, full_hi) complete for every row."""
    lo_raw = tl.maximum(a0 + off - LEFT, 0)
    hi = tl.minimum(a_last + off + RIGHT + 1, n_other)
    lo = lo_raw // BLOCK * BLOCK
    full_from = tl.maximum(a_last + off - LEFT, lo)
    full_lo = lo + tl.cdiv(full_from - lo, BLOCK) * BLOCK
    full_to = tl.minimum(a0 + off + RIGHT + 1, n_other)
    full_hi = lo + tl.maximum(full_to - lo, 0) // BLOCK * BLOCK
    hi_tiles = lo + tl.cdiv(tl.maximum(hi - lo, 0), BLOCK) * BLOCK
    full_lo = tl.minimum(full_lo, hi_tiles)
    full_hi = tl.maximum(full_hi, full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def key_span(m0, m_last, nq, nk, LEFT, RIGHT, BLOCK_N: tl.constexpr):
    """Key tiles for the query rows m0..m_last."""
    return _span(m0, m_last, nk - nq, LEFT, RIGHT, nk, BLOCK_N)


@triton.jit
def query_span(n0, n_last, nq, nk, LEFT, RIGHT, BLOCK_M: tl.constexpr):
    """Query tiles for the key rows n0..n_last (i in [j - off - RIGHT, j - off + LEFT])."""
    return _span(n0, n_last, nq - nk, RIGHT, LEFT, nq, BLOCK_M)


@triton.jit
def band_keep(i, j, nq, nk, LEFT, RIGHT):
    """The keep mask for query indices i and key indices j, already shaped to broadcast (e.g.
    ``offs_m[:, None]`` and ``offs_n[None, :]``, or transposed)."""
    d = j - i - (nk - nq)
    return (i < nq) & (j < nk) & (d >= -LEFT) & (d <= RIGHT)
