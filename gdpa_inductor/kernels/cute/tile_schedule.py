"""The tile sequence of the persistent Blackwell forward: plain integer arithmetic, traced by ``GdpaFwdSm100`` and run
as it is by the CPU tests against a brute-force enumeration.

The work tiles are (query tile, head, sample rank), numbered query tiles fastest, then heads, then samples in rank
order (a varlen batch's ranks are its samples longest first, ``varlen_schedule``'s order), so the tiles of the
longest samples come first. CTA ``c`` of a grid of ``num_ctas`` takes tiles ``c``, ``c + num_ctas``, ... (a static
round robin: every warp of the CTA walks the same sequence without talking to the others). Under a band (causal,
windows) a head's query tiles run last-first: under the causal mask the last query tile computes the most key
tiles. A tile whose query tile starts past its sample's queries has no work and is skipped by every warp.
"""

from __future__ import annotations


def tile_count(num_m, heads, samples):
    """Work tiles of ``samples`` samples of ``heads`` heads and ``num_m`` query tiles each (the longest sample's)."""
    return num_m * heads * samples


def tile_coords(tile, num_m, heads, last_first: bool):
    """(query tile, head, sample rank) of work tile ``tile``; with ``last_first`` a head's query tiles count down."""
    position = tile % num_m
    rest = tile // num_m
    m_blk = num_m - 1 - position if last_first else position
    return m_blk, rest % heads, rest // heads


def has_rows(m_blk, nq, tile_m: int):
    """Whether query tile ``m_blk`` of a sample of ``nq`` queries holds any of them (else its tile is skipped)."""
    return m_blk * tile_m < nq


def cta_tiles(cta: int, num_ctas: int, num_tiles: int) -> range:
    """The work tiles CTA ``cta`` walks, in order (the kernel's loop; its tiles without rows are skipped)."""
    return range(cta, num_tiles, num_ctas)
