"""The CuTe forward's persistent grid (no GPU needed): one CTA per SM, never more than the tiles; where the tiles'
work depends on their query tile position (the causal mask; jagged varlen samples) a grid coprime with the
positions, so that the static round robin hands every CTA each position in turn and the CTAs' work comes out
even (the one-CTA-per-SM grid of 132 pins each CTA to a few positions: measured 1.13-1.58x slower causal and
1.12-1.20x slower over jagged lengths on H200, docs/benchmarks.md)."""

from __future__ import annotations

import math

import pytest
import torch

from gdpa_inductor.kernels.cute.fwd_plan import persistent_grid
from gdpa_inductor.kernels.cute.fwd_support import score_bias_support
from gdpa_inductor.kernels.cute.operand_views import bias_4d


def _key_tiles_per_cta(grid: int, heads: int, num_m: int, offset_tiles: int = 0) -> list[int]:
    """Key tiles each CTA computes when CTA c runs tiles c, c + grid, ... (query tiles fastest, longest first)."""
    work = [0] * grid
    for tile in range(heads * num_m):
        work[tile % grid] += num_m - tile % num_m + offset_tiles
    return work


@pytest.mark.parametrize("tiles, sms, num_m", [(10, 132, 2), (132, 132, 16), (1000, 132, 1), (5000, 78, 4)])
def test_dense_grid_is_one_cta_per_sm_at_most_the_tiles(tiles, sms, num_m):
    assert persistent_grid(tiles, sms, num_m, False) == min(tiles, sms)


@pytest.mark.parametrize("num_m", [1, 2, 3, 4, 8, 11, 12, 16, 33, 64, 131, 132, 264])
@pytest.mark.parametrize("sms", [132, 114, 78])
def test_causal_grid_is_the_largest_coprime_with_the_query_tiles(num_m, sms):
    tiles = 4608 * num_m
    grid = persistent_grid(tiles, sms, num_m, True)
    assert 1 <= grid <= sms and math.gcd(grid, num_m) == 1
    assert all(math.gcd(g, num_m) != 1 for g in range(grid + 1, sms + 1))


def test_causal_grid_of_one_round_keeps_every_tile_its_cta():
    """Tiles that fit one round (each CTA runs one) need no balancing: one CTA per tile."""
    assert persistent_grid(96, 132, 16, True) == 96
    assert persistent_grid(132, 132, 4, True) == 132


@pytest.mark.parametrize("num_m, offset_tiles", [(2, 0), (4, 0), (8, 0), (16, 0), (12, 0), (4, 2), (8, 1)])
def test_causal_grid_evens_out_the_key_tiles(num_m, offset_tiles):
    """H=4 heads of B = 590K / (128 num_m) samples on 132 SMs: the busiest CTA carries within 2% of the mean,
    where the one-CTA-per-SM grid gave it 17-60% more."""
    heads = 4 * (590_000 // (128 * num_m))
    grid = persistent_grid(heads * num_m, 132, num_m, True)
    work = _key_tiles_per_cta(grid, heads, num_m, offset_tiles)
    assert max(work) / (sum(work) / len(work)) < 1.02
    if math.gcd(132, num_m) != 1:
        old = _key_tiles_per_cta(132, heads, num_m, offset_tiles)
        assert max(old) / (sum(old) / len(old)) > 1.1


@pytest.mark.parametrize("shape, batch", [((6, 1, 1, 64), (6,)), ((2, 3, 4, 1, 64), (2, 3)), ((1, 64), (5,)),
                                          ((64,), (2,)), ((6, 4, 1, 64), (6,))])
def test_one_row_bias_seen_as_every_query_row(shape, batch):
    """A bias of one row for every query (a key-padding bias) reaches the kernels as Nq rows of stride 0 over its own
    storage (no copy), [Zb, Hb, Nq, Nk] with Zb 1 or the batch, and the forward's bias check takes it."""
    nq, heads = 40, 4
    bias = torch.randn(shape, dtype=torch.bfloat16)
    got = bias_4d(bias, batch, nq)
    full = torch.broadcast_to(bias, (*batch, heads, nq, 64)).reshape(-1, heads, nq, 64)
    assert got.shape[2:] == (nq, 64) and got.stride(2) == 0
    assert got.untyped_storage().data_ptr() == bias.untyped_storage().data_ptr()
    assert torch.equal(got.expand(full.shape[0], heads, nq, 64), full)
    q = torch.empty(full.shape[0], heads, nq, 128, dtype=torch.bfloat16)
    assert score_bias_support(got, q, torch.empty(full.shape[0], heads, 64, 128, dtype=torch.bfloat16)) == (True, "")


@pytest.mark.parametrize("shape, nq", [((6, 4, 40, 64), 40), ((6, 1, 1, 64), 1), ((6, 4, 40, 1), 40)])
def test_other_biases_keep_their_rows(shape, nq):
    """A bias over every row, and one row where there is one query, stay as they are; one broadcast over the columns
    (a value per query) too, which the forward's check then refuses, naming the shape it takes."""
    bias = torch.randn(shape, dtype=torch.bfloat16)
    got = bias_4d(bias, (6,), nq)
    assert got.shape == shape and got.stride() == bias.stride()
    if shape[-1] == 1:
        q, k = torch.empty(6, 4, nq, 128, dtype=torch.bfloat16), torch.empty(6, 4, 64, 128, dtype=torch.bfloat16)
        ok, reason = score_bias_support(got, q, k)
        assert not ok and "(Nq, Nk) = (40, 64)" in reason
