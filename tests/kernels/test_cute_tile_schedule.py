"""The persistent Blackwell kernels' tile sequences (``tile_schedule``, the arithmetic the kernels trace), against a
brute-force enumeration: over all CTAs of a grid, every forward (query tile, head, sample) holding rows of its sample,
and every backward (key tile, head, sample) holding keys of a sample with queries, is taken exactly once and no other,
for random jagged batches (empty samples, samples without keys, dense sides) under no mask, the causal mask and
windows, on grids of one CTA, a few, every tile and the plans' (``Sm100FwdPlan.grid``, ``Sm100BwdPlan.grid``). The
samples come in the varlen schedule's order (the most work first); under a band a head's query tiles with the most key
tiles (``band_key_tiles``) come first in the forward, its key tiles with the most query tiles
(``band_query_tiles``) in the backward, where a window bounded only on the left takes them last-first. Spoiled
walks fail these checks."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from gdpa_inductor.kernels.common.window_bounds import UNBOUNDED, band_limits
from gdpa_inductor.kernels.cute.band_tiles import band_key_tiles, band_query_tiles
from gdpa_inductor.kernels.cute.bwd_plan import plan_bwd_sm100
from gdpa_inductor.kernels.cute.fwd_plan import plan_fwd_sm100
from gdpa_inductor.kernels.cute.tile_schedule import (
    band_key_tile,
    cta_tiles,
    has_rows,
    key_tile_runs,
    tile_coords,
    tile_count,
)
from gdpa_inductor.kernels.triton.varlen_schedule import ORDER, row, varlen_sides

TILE_M, TILE_N = 128, 128
# (causal, window) as the op takes them, -1 unbounded
MASKS = [(False, (-1, -1)), (True, (-1, -1)), (False, (200, 0)), (True, (64, -1)), (False, (-1, 300))]


def jagged_batch(rng: random.Random, batch: int, heads: int):
    """Rows, order and query tiles of the longest sample, as the varlen launcher gets them: jagged queries
    (some samples empty) and jagged keys (some samples without keys)."""
    nq = [rng.choice([0, 1, 127, 128, 129, 300, 700, 1030]) for _ in range(batch)]
    nk = [rng.choice([0, 5, 128, 256, 513, 1100]) for _ in range(batch)]
    cu_q = torch.tensor([0, *itertools.accumulate(nq)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(nk)], dtype=torch.int32)
    q = torch.zeros(max(sum(nq), 1), heads, 8)
    k = torch.zeros(max(sum(nk), 1), heads, 8)
    qs, ks, schedule = varlen_sides(q, k, cu_q, cu_k, None, None, max(nq), max(nk), batch)
    rows = torch.stack([qs.starts, qs.lengths, ks.starts, ks.lengths, row(schedule, ORDER)]).tolist()
    return rows, -(-max(nq) // TILE_M)


def walk(rows, num_m: int, heads: int, num_ctas: int, last_first: bool) -> list[list[tuple[int, int, int]]]:
    """Each CTA's (query tile, head, sample index z) in the order it takes them, as every warp of it decodes them."""
    samples = len(rows[0])
    taken = []
    for cta in range(num_ctas):
        mine = []
        for tile in cta_tiles(cta, num_ctas, tile_count(num_m, heads, samples)):
            m_blk, h, rank = tile_coords(tile, num_m, heads, last_first)
            if has_rows(m_blk, rows[1][rank], TILE_M):
                mine.append((m_blk, h, rows[4][rank]))
        taken.append(mine)
    return taken


def expected(rows, heads: int) -> list[tuple[int, int, int]]:
    """Brute force: every query tile of every sample that holds any of its queries, each head."""
    found = []
    for nq, z in zip(rows[1], rows[4]):
        for m in range(math.ceil(nq / TILE_M)):
            found += [(m, h, z) for h in range(heads)]
    return sorted(found)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("causal, window", MASKS)
def test_every_tile_with_rows_is_taken_once(seed, causal, window):
    rng = random.Random(seed)
    heads, batch = rng.choice([1, 2, 3]), rng.choice([1, 2, 5, 9])
    rows, num_m = jagged_batch(rng, batch, heads)
    if num_m == 0:
        return
    band = causal or tuple(window) != (-1, -1)
    plan = plan_fwd_sm100(torch.bfloat16, 128, "silu", causal=causal, window=tuple(window) != (-1, -1), varlen=True)
    tiles = tile_count(num_m, heads, batch)
    grids = {1, tiles, plan.grid(tiles, num_m, 132), plan.grid(tiles, num_m, 148), plan.grid(tiles, num_m, 7)}
    for num_ctas in grids:
        taken = walk(rows, num_m, heads, num_ctas, band)
        assert sorted(t for mine in taken for t in mine) == expected(rows, heads), (num_ctas, rows)


def test_a_dense_batch_is_every_tile():
    """Dense: Z samples of Nq rows each, no tile skipped; the grid never exceeds the tiles or the SMs."""
    heads, samples, nq = 3, 4, 1000
    num_m = -(-nq // TILE_M)
    rows = [[0] * samples, [nq] * samples, [0] * samples, [nq] * samples, list(range(samples))]
    for causal in (False, True):
        plan = plan_fwd_sm100(torch.bfloat16, 64, "relu", causal=causal)
        tiles = tile_count(num_m, heads, samples)
        for sms in (132, 148, 20, 200):
            num_ctas = plan.grid(tiles, num_m, sms)
            assert 1 <= num_ctas <= min(sms, tiles)
            if causal and num_ctas < tiles:
                # uneven work by query tile position: the grid is coprime with the query tiles of a head
                assert math.gcd(num_ctas, num_m) == 1
            taken = walk(rows, num_m, heads, num_ctas, causal)
            assert sorted(t for mine in taken for t in mine) == expected(rows, heads)
            # a static round robin: CTAs' tile counts differ by at most one
            counts = [len(mine) for mine in taken]
            assert max(counts) - min(counts) <= 1


def test_the_grid_counts_the_ctas_an_sm_holds():
    plan = plan_fwd_sm100(torch.bfloat16, 128, "silu")
    assert plan.q_stages == 2 and plan.grid(1000, 8, 148) == 148
    # two CTAs of 64-key tiles at D = 64 fit an SM (256 tensor-memory columns, 64 KB of shared memory each)
    small = plan_fwd_sm100(torch.bfloat16, 64, "silu", tile_n=64)
    assert small.ctas_per_sm == 2 and small.grid(1000, 8, 148) == 296
    for d, tile_n in [(64, 128), (128, 64)]:
        assert plan_fwd_sm100(torch.bfloat16, d, "silu", tile_n=tile_n).ctas_per_sm == 1


@pytest.mark.parametrize("seed", range(4))
def test_the_longest_samples_come_first(seed):
    """Sample ranks in the tile sequence follow the varlen schedule's order (queries x keys, the most first), and
    under the causal mask a head's query tiles come in nonincreasing key tile counts."""
    rng = random.Random(100 + seed)
    heads, batch = 2, 8
    rows, num_m = jagged_batch(rng, batch, heads)
    work = [nq * nk for nq, nk in zip(rows[1], rows[3])]
    assert work == sorted(work, reverse=True)
    left, right = band_limits(True, (-1, -1))
    assert left == UNBOUNDED
    ranks_seen = []
    for tile in range(tile_count(num_m, heads, batch)):
        m_blk, h, rank = tile_coords(tile, num_m, heads, True)
        ranks_seen.append(rank)
        nq, nk = rows[1][rank], rows[3][rank]
        if tile % num_m and has_rows(m_blk + 1, nq, TILE_M) and nk > 0:
            # the query tile before this one in the sequence computes at least as many key tiles
            before = band_key_tiles(m_blk + 1, nq, nk, left, right, TILE_M, TILE_N)[1]
            assert before >= band_key_tiles(m_blk, nq, nk, left, right, TILE_M, TILE_N)[1]
    assert ranks_seen == sorted(ranks_seen)


# --- the persistent Blackwell backward: (key tile, head, sample rank) tiles, key tiles first-first ---


def bwd_coords(tile: int, num_n: int, heads: int, right: int, last_first: bool = False):
    """(key tile, head, sample rank) of a backward work tile under a band of right bound ``right`` (0 for the causal
    mask and for no band, whose order is the same), as ``GdpaBwdSm100._tile`` decodes it; ``last_first`` spoils it."""
    position, h, rank = tile_coords(tile, num_n, heads, last_first)
    return band_key_tile(position, num_n, right), h, rank


def walk_bwd(rows, num_n: int, heads: int, num_ctas: int, right: int = 0, last_first: bool = False,
             stride: int | None = None, skip=key_tile_runs) -> list[list[tuple[int, int, int]]]:
    """Each CTA's (key tile, head, sample index z) in the order it takes them, as every warp of ``GdpaBwdSm100``
    decodes them (``_tile``); ``last_first``, ``stride`` and ``skip`` let a test spoil the walk on purpose."""
    samples = len(rows[0])
    taken = []
    for cta in range(num_ctas):
        mine = []
        for tile in cta_tiles(cta, stride or num_ctas, tile_count(num_n, heads, samples)):
            n_blk, h, rank = bwd_coords(tile, num_n, heads, right, last_first)
            if skip(n_blk, rows[1][rank], rows[3][rank], TILE_N):
                mine.append((n_blk, h, rows[4][rank]))
        taken.append(mine)
    return taken


def expected_bwd(rows, heads: int) -> list[tuple[int, int, int]]:
    """Brute force: every key tile holding keys of a sample with queries, each head."""
    found = []
    for nq, nk, z in zip(rows[1], rows[3], rows[4]):
        if nq > 0:
            for n in range(math.ceil(nk / TILE_N)):
                found += [(n, h, z) for h in range(heads)]
    return sorted(found)


def visited_once(taken, rows, heads: int) -> bool:
    return sorted(t for mine in taken for t in mine) == expected_bwd(rows, heads)


def most_queries_first(rows, num_n: int, heads: int, window, last_first: bool = False, order_right=None) -> bool:
    """Whether along the tile sequence a head's key tiles come in nonincreasing counts of the query tiles they
    compute (``band_query_tiles``) under the band of ``window`` (the causal mask: (-1, 0)); ``last_first`` and
    ``order_right`` (the right bound the order is taken from, if not the band's) spoil the order."""
    left, right = band_limits(False, window)
    order_right = right if order_right is None else order_right
    for tile in range(tile_count(num_n, heads, len(rows[0]))):
        n_blk, h, rank = bwd_coords(tile, num_n, heads, order_right, last_first)
        nq, nk = rows[1][rank], rows[3][rank]
        following = tile + 1
        if following % num_n == 0 or nq == 0:
            continue
        n_next = bwd_coords(following, num_n, heads, order_right, last_first)[0]
        if has_rows(n_blk, nk, TILE_N) and has_rows(n_next, nk, TILE_N):
            here = band_query_tiles(n_blk, nq, nk, left, right, TILE_M, TILE_N)[1]
            if band_query_tiles(n_next, nq, nk, left, right, TILE_M, TILE_N)[1] > here:
                return False
    return True


def key_tiles_of(rows) -> int:
    return -(-max(rows[3]) // TILE_N)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("causal, window", [*MASKS, (False, (200, -1))])
def test_backward_every_key_tile_with_keys_is_taken_once(seed, causal, window):
    """Random jagged batches (empty samples, samples without keys) on grids of one CTA, a few, every tile and the
    plan's for several SM counts: each (key tile, head, sample) holding keys of a sample with queries is taken by
    exactly one CTA, and no other tile."""
    rng = random.Random(1000 + seed)
    heads, batch = rng.choice([1, 2, 3]), rng.choice([1, 2, 5, 9])
    rows, _ = jagged_batch(rng, batch, heads)
    num_n = key_tiles_of(rows)
    if num_n == 0:
        return
    windowed = tuple(window) != (-1, -1)
    plan = plan_bwd_sm100(torch.bfloat16, 128, "silu", causal=causal, window=windowed, varlen=True)
    right = band_limits(causal, window)[1] if windowed else 0
    tiles = tile_count(num_n, heads, batch)
    grids = {min(few, tiles) for few in (1, 2, 3)} | {tiles, *(plan.grid(tiles, num_n, sms) for sms in (7, 132, 148))}
    for num_ctas in grids:
        assert 1 <= num_ctas <= tiles
        assert visited_once(walk_bwd(rows, num_n, heads, num_ctas, right), rows, heads), (num_ctas, rows)


def test_backward_a_wrong_walk_is_caught():
    """The checks fail for spoiled schedules: a stride other than the grid (tiles taken twice or never), the
    forward's skip rule (queries in place of keys), under the causal mask key tiles last-first, and under a window
    without a right bound first-first."""
    rows = [[0, 1030, 1160], [1030, 130, 0], [0, 1100, 1613], [1100, 513, 0], [2, 0, 1]]
    heads, num_n = 2, key_tiles_of(rows)
    assert visited_once(walk_bwd(rows, num_n, heads, 5), rows, heads)
    assert not visited_once(walk_bwd(rows, num_n, heads, 5, stride=6), rows, heads)
    assert not visited_once(walk_bwd(rows, num_n, heads, 5, stride=4), rows, heads)

    def by_queries(n_blk, nq, nk, tile):
        return has_rows(n_blk, nq, tile)

    assert not visited_once(walk_bwd(rows, num_n, heads, 5, skip=by_queries), rows, heads)
    assert most_queries_first(rows, num_n, heads, (-1, 0))
    assert not most_queries_first(rows, num_n, heads, (-1, 0), last_first=True)
    assert most_queries_first(rows, num_n, heads, (200, -1))
    assert not most_queries_first(rows, num_n, heads, (200, -1), order_right=0)


@pytest.mark.parametrize("seed", range(4))
def test_backward_the_key_tiles_with_most_queries_come_first(seed):
    """Under a band bounded on one side (at any Nk - Nq) a head's key tiles come in nonincreasing counts of the query
    tiles they compute: first-first under the bottom-right aligned causal mask and windows bounded on the right,
    last-first under windows bounded on the left alone; sample ranks follow the varlen schedule's order (the varlen
    forward's)."""
    rng = random.Random(200 + seed)
    heads, batch = 2, 8
    rows, _ = jagged_batch(rng, batch, heads)
    num_n = key_tiles_of(rows)
    for window in [(-1, 0), (-1, 300), (-1, 5), (200, -1), (0, -1)]:
        assert most_queries_first(rows, num_n, heads, window), window
    ranks = [tile_coords(tile, num_n, heads, False)[2] for tile in range(tile_count(num_n, heads, batch))]
    assert ranks == sorted(ranks)
    work = [nq * nk for nq, nk in zip(rows[1], rows[3])]
    assert work == sorted(work, reverse=True)


def test_backward_grid():
    """One CTA an SM at most, never more than the tiles; coprime with the key tiles a head where tiles differ in work
    by position (a band, jagged samples) and there are more tiles than CTAs; a dense batch's CTAs take tile counts
    differing by one at most."""
    for causal, window, varlen in [(False, False, False), (True, False, False), (False, True, False),
                                   (False, False, True)]:
        plan = plan_bwd_sm100(torch.bfloat16, 64, "silu", causal=causal, window=window, varlen=varlen)
        for tiles, num_n, sms in [(1000, 8, 148), (1000, 16, 132), (100, 4, 148), (33, 11, 20), (5000, 12, 148)]:
            grid = plan.grid(tiles, num_n, sms)
            assert 1 <= grid <= min(tiles, sms)
            if (causal or window or varlen) and tiles > grid:
                assert math.gcd(grid, num_n) == 1
            elif tiles > sms:
                assert grid == sms
    heads, samples, nk = 3, 4, 1000
    num_n = -(-nk // TILE_N)
    rows = [[0] * samples, [700] * samples, [0] * samples, [nk] * samples, list(range(samples))]
    plan = plan_bwd_sm100(torch.bfloat16, 128, "silu", causal=True)
    for sms in (7, 20, 132):
        num_ctas = plan.grid(tile_count(num_n, heads, samples), num_n, sms)
        taken = walk_bwd(rows, num_n, heads, num_ctas)
        assert visited_once(taken, rows, heads)
        counts = [len(mine) for mine in taken]
        assert max(counts) - min(counts) <= 1
