"""Which key tiles a query tile computes under a band mask (the forward), which query tiles a key tile computes (the
backward), and which of them need no per-score mask: plain integer arithmetic, traced by the Blackwell kernels
(``min``/``max`` passed as ``cutlass.min``/``cutlass.max``) and run as it is by the CPU tests against a brute-force
mask.

Key j is kept for query i of a sample of ``nq`` queries and ``nk`` keys iff ``0 <= j < nk`` and
``-left <= j - i - (nk - nq) <= right`` (``window_bounds.band_limits``: causal is ``right = 0``, a side without bound
``UNBOUNDED``). Only the query tile's rows below ``nq`` count: the rest are never stored. Every numerator of a
division is made non-negative first, so truncating and flooring division agree.
"""

from __future__ import annotations


def band_key_tiles(m_blk, nq, nk, left, right, tile_m: int, tile_n: int, smaller=min, larger=max):
    """(first, count): the key tiles query tile ``m_blk`` computes, from that of its first row's first kept key to
    that of its last row's last, clipped to the ``nk`` > 0 keys; at least one, so a query tile whose band misses
    every key runs one wholly masked tile (O = 0)."""
    shift = nk - nq
    row0 = m_blk * tile_m
    row1 = smaller(row0 + tile_m, nq) - 1
    lo = larger(row0 + shift - left, 0)
    hi = smaller(row1 + shift + right, nk - 1)
    first = smaller(lo // tile_n, (nk + tile_n - 1) // tile_n - 1)
    return first, larger(larger(hi, 0) // tile_n - first + 1, 1)


def unmasked_key_tiles(m_blk, nq, nk, left, right, tile_m: int, tile_n: int, smaller=min, larger=max):
    """[begin, end): the key tiles whose every score is kept for every row of query tile ``m_blk`` below ``nq``
    (whole tiles within ``nk``, inside the band for the last row's left bound and the first row's right bound); the
    computed tiles outside it take the per-score mask. Empty (begin >= end) where no tile is whole."""
    shift = nk - nq
    row0 = m_blk * tile_m
    row1 = smaller(row0 + tile_m, nq) - 1
    begin = (larger(row1 + shift - left, 0) + tile_n - 1) // tile_n
    end = smaller(larger(row0 + shift + right + 1, 0) // tile_n, nk // tile_n)
    return begin, end


def band_query_tiles(n_blk, nq, nk, left, right, tile_m: int, tile_n: int, smaller=min, larger=max):
    """(first, count): the query tiles key tile ``n_blk`` computes (the backward's loop), from that of its first key's
    first kept query to that of its last key's last, clipped to the ``nq`` > 0 queries; at least one, so a key tile
    whose band misses every query runs one wholly masked tile (dK = dV = 0)."""
    shift = nk - nq
    col0 = n_blk * tile_n
    col1 = smaller(col0 + tile_n, nk) - 1
    lo = larger(col0 - shift - right, 0)
    hi = smaller(col1 - shift + left, nq - 1)
    first = smaller(lo // tile_m, (nq + tile_m - 1) // tile_m - 1)
    return first, larger(larger(hi, 0) // tile_m - first + 1, 1)


def unmasked_query_tiles(n_blk, nq, nk, left, right, tile_m: int, tile_n: int, smaller=min, larger=max):
    """[begin, end): the query tiles whose every score is kept for every key of tile ``n_blk`` below ``nk`` (whole
    tiles within ``nq``, inside the band for the first key's left bound and the last key's right bound); the computed
    tiles outside it take the per-score mask, which also drops queries past ``nq``."""
    shift = nk - nq
    col0 = n_blk * tile_n
    col1 = smaller(col0 + tile_n, nk) - 1
    begin = (larger(col1 - shift - right, 0) + tile_m - 1) // tile_m
    end = larger(smaller(col0 - shift + left + 1, nq), 0) // tile_m
    return begin, end


def tile_limits(m_blk, n_blk, nq, nk, left, right, tile_m: int, tile_n: int):
    """(valid, least, greatest) of key tile ``n_blk`` for query tile ``m_blk``: the score at tile coordinate (r, c) is
    kept iff c < valid (its key within ``nk``) and least <= c - r <= greatest (``score_kept``), as key j = n0 + c is
    kept for query i = m0 + r iff -left <= j - i - (nk - nq) <= right."""
    shift = n_blk * tile_n - m_blk * tile_m - (nk - nq)
    return nk - n_blk * tile_n, 0 - left - shift, right - shift


def score_kept(col, row, limits, lower: bool = True):
    """Whether the score at tile coordinate (``row``, ``col``) is kept under ``tile_limits``' ``limits`` (``lower``
    False: no left bound, the causal mask alone); written with ``&`` so that it takes the kernel's values and tensors
    of coordinates alike."""
    valid, least, greatest = limits
    kept = (col < valid) & (col - row <= greatest)
    return kept & (col - row >= least) if lower else kept


def kept_queries(key, limits, lower: bool, limit, smaller=min, larger=max):
    """[first, last]: the query coordinates of a transposed tile (the backward's, a thread a key row) kept for key
    coordinate ``key`` under ``tile_limits``' ``limits`` (``score_kept(key, query, limits, lower)`` but for the key's
    own bound, ``limits[0]``: the backward never stores a key past Nk, and its zero K and V rows add nothing to dQ)
    and below ``limit`` (queries past Nq); empty (first > last) where none is. Two compares a score against this
    thread's bounds, in place of ``score_kept``'s arithmetic."""
    _, least, greatest = limits
    first = larger(key - greatest, 0)
    last = limit - 1
    if lower:
        last = smaller(last, key - least)
    return first, last


def kept_columns(limits, row, smaller=min):
    """(first, last): the columns ``score_kept`` keeps in tile row ``row`` under ``tile_limits``' ``limits``, a
    contiguous run (empty where first > last; causal alone keeps from column 0, ``first`` then unused). Per row, so
    that a kernel compares each score's constant column with two values of the tile instead of holding a
    column - row per score."""
    valid, least, greatest = limits
    return least + row, smaller(valid - 1, greatest + row)
