"""The key tiles the Blackwell forward computes per query tile, and the query tiles its backward computes per key
tile, under the causal mask and windows (``band_tiles``), checked against a brute-force mask: every tile holding a
kept score is computed, the computed range is no wider than the kept scores need (one wholly masked tile where none
is kept), and every tile run without the per-score mask keeps every score of the tile's valid rows. Then each
kernel's schedule emulated in torch (those tiles, the per-score mask of ``tile_limits`` and ``score_kept`` on the
others, rows past the tensors' ends read as zeros) against the masked product and its gradients, with an activation
that is not zero at zero."""

from __future__ import annotations

import itertools

import pytest
import torch

from gdpa_inductor.kernels.common.window_bounds import UNBOUNDED, band_limits
from gdpa_inductor.kernels.cute.band_tiles import (
    band_key_tiles,
    band_query_tiles,
    kept_columns,
    kept_queries,
    score_kept,
    tile_limits,
    unmasked_key_tiles,
    unmasked_query_tiles,
)

# (causal, (left, right)) as the op takes them: -1 unbounded
BANDS = [(True, (-1, -1)), (False, (0, 0)), (False, (5, -1)), (False, (-1, 3)), (True, (100, -1)),
         (False, (127, 128)), (True, (200, 7)), (False, (64, 0)), (False, (1, 300)), (True, (0, -1))]
SIZES = [1, 7, 64, 127, 128, 129, 200, 256, 300, 385, 512]


def kept(nq: int, nk: int, left: int, right: int) -> torch.Tensor:
    """[nq, nk]: key j kept for query i (``window_bounds``' rule)."""
    d = torch.arange(nk)[None, :] - torch.arange(nq)[:, None] - (nk - nq)
    return (d >= -left) & (d <= right)


def check(nq: int, nk: int, left: int, right: int, tile_m: int, tile_n: int) -> None:
    mask = kept(nq, nk, left, right)
    n_tiles = -(-nk // tile_n)
    for m in range(-(-nq // tile_m)):
        rows = mask[m * tile_m:(m + 1) * tile_m]
        first, count = band_key_tiles(m, nq, nk, left, right, tile_m, tile_n)
        begin, end = unmasked_key_tiles(m, nq, nk, left, right, tile_m, tile_n)
        where = f"nq={nq} nk={nk} band=({left}, {right}) tiles=({tile_m}, {tile_n}) m={m}: {first}+{count}"
        assert 0 <= first and count >= 1 and first + count <= n_tiles, where
        busy = [n for n in range(n_tiles) if rows[:, n * tile_n:(n + 1) * tile_n].any()]
        if busy:
            # exactly the tiles from the first with a kept score to the last
            assert (first, count) == (busy[0], busy[-1] - busy[0] + 1), where
        for n in range(max(begin, 0), end):
            assert (n + 1) * tile_n <= nk and rows[:, n * tile_n:(n + 1) * tile_n].all(), f"{where} unmasked {n}"
        # every whole tile inside the computed range is found: the per-score mask runs only on edge tiles
        for n in range(first, first + count):
            whole = (n + 1) * tile_n <= nk and bool(rows[:, n * tile_n:(n + 1) * tile_n].all())
            assert whole == (begin <= n < end), f"{where} tile {n}: whole={whole}, unmasked [{begin}, {end})"


@pytest.mark.parametrize("causal, window", BANDS, ids=[f"{'c' if c else ''}{w}" for c, w in BANDS])
@pytest.mark.parametrize("tile_n", [64, 128])
def test_key_tiles_match_a_brute_force_mask(causal, window, tile_n):
    left, right = band_limits(causal, window)
    for nq, nk in itertools.product(SIZES, SIZES):
        check(nq, nk, left, right, 128, tile_n)


def test_a_query_tile_without_keys_runs_one_masked_tile():
    # causal with Nq > Nk: the first 300 queries keep no key
    left, right = band_limits(True, (-1, -1))
    assert kept(400, 100, left, right)[:300].sum() == 0
    assert band_key_tiles(0, 400, 100, left, right, 128, 128) == (0, 1)
    begin, end = unmasked_key_tiles(0, 400, 100, left, right, 128, 128)
    assert not begin < end


def test_the_causal_diagonal_tile_is_the_only_masked_one_when_aligned():
    # Nk - Nq a multiple of the tile: query tile m computes m + 1 + (Nk - Nq) / 128 tiles, all but the last whole
    for m in range(4):
        assert band_key_tiles(m, 512, 768, UNBOUNDED, 0, 128, 128) == (0, m + 3)
        assert unmasked_key_tiles(m, 512, 768, UNBOUNDED, 0, 128, 128) == (0, m + 2)


@pytest.mark.parametrize("causal, window", BANDS, ids=[f"{'c' if c else ''}{w}" for c, w in BANDS])
def test_each_row_keeps_one_run_of_columns(causal, window):
    """``kept_columns``, what the kernel compares each score's column with, keeps what ``score_kept`` keeps: per
    row, the columns in [first, last] (from column 0 under the causal mask alone)."""
    left, right = band_limits(causal, window)
    lower = left != UNBOUNDED
    cols = torch.arange(128)
    for nq, nk in [(200, 256), (300, 129), (128, 512), (7, 1)]:
        for m, n in itertools.product(range(-(-nq // 128)), range(-(-nk // 128))):
            limits = tile_limits(m, n, nq, nk, left, right, 128, 128)
            for row in (0, 1, 63, 127):
                first, last = kept_columns(limits, row)
                span = (cols <= last) & ((cols >= first) if lower else True)
                assert torch.equal(span, score_kept(cols, row, limits, lower)), (nq, nk, m, n, row)


def test_the_check_can_fail():
    """A range one tile short, or an unmasked range one tile too wide, is caught."""
    left, right = band_limits(True, (-1, -1))

    tiles, unmasked = band_key_tiles, unmasked_key_tiles

    def short(*args):
        first, count = tiles(*args)
        return first, max(count - 1, 1)

    def wide(*args):
        begin, end = unmasked(*args)
        return begin, end + 1

    for name, broken in (("band_key_tiles", short), ("unmasked_key_tiles", wide)):
        original = globals()[name]
        globals()[name] = broken
        try:
            with pytest.raises(AssertionError):
                check(300, 300, left, right, 128, 128)
        finally:
            globals()[name] = original


def emulate(q, k, v, left: int, right: int, lower: bool, tile_m: int, tile_n: int) -> torch.Tensor:
    """The Blackwell forward's O = act(S) V per query tile, as its warps compute it: the key tiles of
    ``band_key_tiles`` in order, those outside ``unmasked_key_tiles`` masked per score (``score_kept``), rows and keys
    past the tensors' ends read as zeros; act = sigmoid (0.5 at zero: a masked score left in shows)."""
    nq, nk = q.shape[0], k.shape[0]
    pad = tile_m + tile_n * (-(-nk // tile_n))
    qp = torch.cat([q, q.new_zeros(tile_m, q.shape[1])])
    kp, vp = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (k, v))
    out = torch.zeros(nq, v.shape[1], dtype=q.dtype)
    r, c = torch.arange(tile_m)[:, None], torch.arange(tile_n)[None, :]
    for m in range(-(-nq // tile_m)):
        first, count = band_key_tiles(m, nq, nk, left, right, tile_m, tile_n)
        begin, end = unmasked_key_tiles(m, nq, nk, left, right, tile_m, tile_n)
        qm = qp[m * tile_m:(m + 1) * tile_m]
        o = torch.zeros(tile_m, v.shape[1], dtype=q.dtype)
        for n in range(first, first + count):
            kn, vn = kp[n * tile_n:(n + 1) * tile_n], vp[n * tile_n:(n + 1) * tile_n]
            p = torch.sigmoid(qm @ kn.T)
            if not begin <= n < end:
                limits = tile_limits(m, n, nq, nk, left, right, tile_m, tile_n)
                p = torch.where(score_kept(c, r, limits, lower), p, 0.0)
            o += p @ vn
        out[m * tile_m:(m + 1) * tile_m] = o[:nq - m * tile_m]
    return out


@pytest.mark.parametrize("causal, window", BANDS, ids=[f"{'c' if c else ''}{w}" for c, w in BANDS])
def test_the_emulated_schedule_matches_the_masked_product(causal, window):
    left, right = band_limits(causal, window)
    lower = tuple(window) != (-1, -1)
    g = torch.Generator().manual_seed(0)
    for nq, nk, tile_n in [(1, 1, 128), (200, 256, 128), (300, 129, 64), (129, 385, 128), (256, 256, 64),
                           (385, 300, 128), (64, 512, 64)]:
        q, k, v = (torch.randn(n, 8, generator=g, dtype=torch.float64) for n in (nq, nk, nk))
        expected = (torch.sigmoid(q @ k.T) * kept(nq, nk, left, right)) @ v
        got = emulate(q, k, v, left, right, lower, 128, tile_n)
        torch.testing.assert_close(got, expected, msg=f"nq={nq} nk={nk} tile_n={tile_n}")


def elementwise_min(a, b):
    return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))


def elementwise_max(a, b):
    return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))


def check_queries(nq: int, nk: int, left: int, right: int, tile_m: int, tile_n: int) -> None:
    """The backward's query tiles of each key tile against the brute-force mask, as ``check`` does the forward's."""
    mask = kept(nq, nk, left, right)
    m_tiles = -(-nq // tile_m)
    for n in range(-(-nk // tile_n)):
        cols = mask[:, n * tile_n:(n + 1) * tile_n]
        first, count = band_query_tiles(n, nq, nk, left, right, tile_m, tile_n)
        begin, end = unmasked_query_tiles(n, nq, nk, left, right, tile_m, tile_n)
        where = f"nq={nq} nk={nk} band=({left}, {right}) tiles=({tile_m}, {tile_n}) n={n}: {first}+{count}"
        assert 0 <= first and count >= 1 and first + count <= m_tiles, where
        busy = [m for m in range(m_tiles) if cols[m * tile_m:(m + 1) * tile_m].any()]
        if busy:
            assert (first, count) == (busy[0], busy[-1] - busy[0] + 1), where
        for m in range(first, first + count):
            whole = (m + 1) * tile_m <= nq and bool(cols[m * tile_m:(m + 1) * tile_m].all())
            assert whole == (begin <= m < end), f"{where} tile {m}: whole={whole}, unmasked [{begin}, {end})"


@pytest.mark.parametrize("causal, window", BANDS, ids=[f"{'c' if c else ''}{w}" for c, w in BANDS])
def test_query_tiles_match_a_brute_force_mask(causal, window):
    left, right = band_limits(causal, window)
    for nq, nk in itertools.product(SIZES, SIZES):
        check_queries(nq, nk, left, right, 128, 128)


def test_a_key_tile_without_queries_runs_one_masked_tile():
    # the diagonal alone with Nk > Nq: the first 300 keys reach no query
    for n in (0, 1):
        assert kept(100, 400, 0, 0)[:, n * 128:(n + 1) * 128].sum() == 0
        assert band_query_tiles(n, 100, 400, 0, 0, 128, 128) == (0, 1)
        begin, end = unmasked_query_tiles(n, 100, 400, 0, 0, 128, 128)
        assert not begin < end


def test_the_query_tile_check_can_fail():
    left, right = band_limits(True, (-1, -1))
    tiles, unmasked = band_query_tiles, unmasked_query_tiles

    def short(*args):
        first, count = tiles(*args)
        return first, max(count - 1, 1)

    def wide(*args):
        begin, end = unmasked(*args)
        return begin - 1, end

    for name, broken in (("band_query_tiles", short), ("unmasked_query_tiles", wide)):
        original = globals()[name]
        globals()[name] = broken
        try:
            with pytest.raises(AssertionError):
                check_queries(300, 300, left, right, 128, 128)
        finally:
            globals()[name] = original


def emulate_backward(q, k, v, do, left: int, right: int, lower: bool, tile: int):
    """The Blackwell backward's (dQ, dK, dV) of O = sigmoid(Q Kᵀ) V per key tile, as its warps compute them: the query
    tiles of ``band_query_tiles`` in order, those outside ``unmasked_query_tiles`` masked per score (``score_kept`` on
    the transposed tile, and queries past Nq), rows past the tensors' ends read as zeros."""
    nq, nk = q.shape[0], k.shape[0]
    def pad(t, n):
        return torch.cat([t, t.new_zeros(-(-n // tile) * tile + tile - n, t.shape[1])])

    qp, dop, kp, vp = pad(q, nq), pad(do, nq), pad(k, nk), pad(v, nk)
    dq, dk, dv = torch.zeros_like(qp), torch.zeros_like(kp), torch.zeros_like(vp)
    key, query = torch.arange(tile)[:, None], torch.arange(tile)[None, :]
    for n in range(-(-nk // tile)):
        first, count = band_query_tiles(n, nq, nk, left, right, tile, tile)
        begin, end = unmasked_query_tiles(n, nq, nk, left, right, tile, tile)
        kn, vn = kp[n * tile:(n + 1) * tile], vp[n * tile:(n + 1) * tile]
        for m in range(first, first + count):
            qm, dom = qp[m * tile:(m + 1) * tile], dop[m * tile:(m + 1) * tile]
            st = kn @ qm.T
            pt, dst = torch.sigmoid(st), (vn @ dom.T) * torch.sigmoid(st) * (1 - torch.sigmoid(st))
            if not begin <= m < end:
                limits = tile_limits(m, n, nq, nk, left, right, tile, tile)
                first_q, last_q = kept_queries(key, limits, lower, nq - m * tile, elementwise_min, elementwise_max)
                keep = (query >= first_q) & (query <= last_q)
                pt, dst = torch.where(keep, pt, 0.0), torch.where(keep, dst, 0.0)
            dv[n * tile:(n + 1) * tile] += pt @ dom
            dk[n * tile:(n + 1) * tile] += dst @ qm
            dq[m * tile:(m + 1) * tile] += dst.T @ kn
    return dq[:nq], dk[:nk], dv[:nk]


@pytest.mark.parametrize("causal, window", BANDS, ids=[f"{'c' if c else ''}{w}" for c, w in BANDS])
def test_the_emulated_backward_matches_autograd(causal, window):
    left, right = band_limits(causal, window)
    lower = tuple(window) != (-1, -1)
    g = torch.Generator().manual_seed(0)
    for nq, nk in [(1, 1), (200, 256), (300, 129), (129, 385), (385, 300)]:
        leaves = [torch.randn(n, 8, generator=g, dtype=torch.float64, requires_grad=True) for n in (nq, nk, nk)]
        do = torch.randn(nq, 8, generator=g, dtype=torch.float64)
        out = (torch.sigmoid(leaves[0] @ leaves[1].T) * kept(nq, nk, left, right)) @ leaves[2]
        expected = torch.autograd.grad(out, leaves, do)
        got = emulate_backward(*(t.detach() for t in leaves), do, left, right, lower, 128)
        for name, a, b in zip("qkv", got, expected):
            torch.testing.assert_close(a, b, msg=f"d{name} nq={nq} nk={nk}")


@pytest.mark.parametrize("causal, window", BANDS, ids=[f"{'c' if c else ''}{w}" for c, w in BANDS])
def test_kept_queries_are_the_kept_scores(causal, window):
    """Each key row's [first, last] query range is exactly its kept scores below the query limit."""
    left, right = band_limits(causal, window)
    lower = tuple(window) != (-1, -1)
    key, query = torch.arange(128)[:, None], torch.arange(128)[None, :]
    for nq, nk in [(200, 256), (300, 129), (129, 385), (385, 300), (64, 64)]:
        for m, n in itertools.product(range(-(-nq // 128)), range(-(-nk // 128))):
            limits = tile_limits(m, n, nq, nk, left, right, 128, 128)
            valid = key < limits[0]
            expected = score_kept(key, query, limits, lower) & (query < nq - m * 128)
            first, last = kept_queries(key, limits, lower, nq - m * 128, elementwise_min, elementwise_max)
            got = (query >= first) & (query <= last)
            assert torch.equal(got & valid, expected), f"nq={nq} nk={nk} m={m} n={n}"
