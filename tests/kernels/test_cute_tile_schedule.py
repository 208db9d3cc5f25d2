"""The persistent Blackwell forward's tile sequence (``tile_schedule``, the arithmetic the kernel traces), against a
brute-force enumeration: over all CTAs of a grid, every (query tile, head, sample) holding rows of its sample is
taken exactly once and no other, for random jagged batches (empty samples, samples without keys, dense sides) under
no mask, the causal mask and windows, on grids of one CTA, of every tile and ``Sm100FwdPlan.grid``'s. The samples
come in the varlen schedule's order (the most work first), and under a band a head's query tiles with the most key
tiles (``band_key_tiles``) come first."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from gdpa_inductor.kernels.common.window_bounds import UNBOUNDED, band_limits
from gdpa_inductor.kernels.cute.band_tiles import band_key_tiles
from gdpa_inductor.kernels.cute.fwd_plan import plan_fwd_sm100
from gdpa_inductor.kernels.cute.tile_schedule import cta_tiles, has_rows, tile_coords, tile_count
from gdpa_inductor.kernels.triton.varlen_schedule import varlen_sides

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
    qs, ks, order = varlen_sides(q, k, cu_q, cu_k, None, None, max(nq), max(nk), batch)
    rows = torch.stack([qs.starts, qs.lengths, ks.starts, ks.lengths, order]).tolist()
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
