"""The tile sequences of the persistent Blackwell kernels: plain integer arithmetic, traced by ``GdpaFwdSm100`` and
``GdpaBwdSm100`` and run as it is by the CPU tests against a brute-force enumeration.

The work tiles are (block, head, sample rank), numbered blocks fastest, then heads, then samples in rank order (a
varlen batch's ranks are its samples longest first, ``varlen_schedule``'s order), so the tiles of the longest samples
come first. A block is a query tile in the forward, a key tile in the backward; ``per_head`` of them a head (the
longest sample's). CTA ``c`` of a grid of ``num_ctas`` takes tiles ``c``, ``c + num_ctas``, ... (a static round
robin: every warp of the CTA walks the same sequence without talking to the others). Under a band (causal, windows)
a head's blocks run in the order that puts those computing the most first: the forward's query tiles last-first
(under the causal mask the last query tile computes the most key tiles), the backward's key tiles first-first (the
first key tile computes the most query tiles, ``band_tiles.band_query_tiles``), or last-first under a window without a
right bound (``band_key_tile``). A tile whose block starts past its sample's rows has no work and is skipped by every
warp.
"""

from __future__ import annotations

from ..common.window_bounds import UNBOUNDED


def tile_count(per_head, heads, samples):
    """Work tiles of ``samples`` samples of ``heads`` heads and ``per_head`` blocks each (the longest sample's)."""
    return per_head * heads * samples


def tile_coords(tile, per_head, heads, last_first: bool):
    """(block, head, sample rank) of work tile ``tile``; with ``last_first`` a head's blocks count down."""
    position = tile % per_head
    rest = tile // per_head
    blk = per_head - 1 - position if last_first else position
    return blk, rest % heads, rest // heads


def band_key_tile(position, num_n, right, smaller=min, larger=max):
    """The backward's key tile at ``position`` of a head's ``num_n`` under a band of right bound ``right``
    (``band_limits``': the causal mask's is 0): ``position`` (first-first: key j meets the queries from
    j - (Nk - Nq) - right on, so the first key tiles compute the most query tiles), or without a right bound
    (``UNBOUNDED``) ``num_n - 1 - position`` (key j meets the queries up to j - (Nk - Nq) + left: the last compute
    the most). Integer arithmetic (``min``/``max`` passed as ``cutlass.min``/``cutlass.max``), the bound a run-time
    value."""
    last_first = smaller(larger(right - (UNBOUNDED - 1), 0), 1)
    return position + last_first * (num_n - 1 - 2 * position)


def has_rows(blk, rows, tile: int):
    """Whether block ``blk`` of ``tile`` rows, of a sample with ``rows`` of them (queries in the forward, keys in
    the backward), holds any (else its tile is skipped)."""
    return blk * tile < rows


def key_tile_runs(n_blk, nq, nk, tile_n: int):
    """Whether the backward's work tile of key tile ``n_blk`` of a sample of ``nq`` queries and ``nk`` keys runs: it
    holds keys, and there are queries to add (else dK, dV of its rows stay the launcher's zeros)."""
    return has_rows(n_blk, nk, tile_n) & (nq > 0)


def cta_tiles(cta: int, num_ctas: int, num_tiles: int) -> range:
    """The work tiles CTA ``cta`` walks, in order (the kernel's loop; its tiles without rows are skipped)."""
    return range(cta, num_tiles, num_ctas)
