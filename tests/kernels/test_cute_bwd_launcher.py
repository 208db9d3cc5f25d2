"""How the CuTe backward's launcher sums dQ (no GPU needed): in place in the operands' dtype up to eight
128-key tiles, so that no dQ value takes more than eight roundings; in an fp32 buffer past them (tests/gpu check
each form's error against the 2x-eager bound); and how the host finishes dQ and dbias from the kernel's sums."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

import dataclasses  # noqa: E402

import torch  # noqa: E402
from gdpa_testing import wgmma_fragments_of  # noqa: E402

import gdpa_inductor.config  # noqa: E402
from gdpa_inductor.kernels.cute.activation_math import backward_form  # noqa: E402
from gdpa_inductor.kernels.cute.bwd_plan import (  # noqa: E402
    LONG_QUERY_TILE,
    WIDE_KEY_TILE,
    bwd_key_tile,
    bwd_query_tile,
    dq_last_round_for,
    dq_late_for,
    dq_sums_for,
    packed_backward,
)
from gdpa_inductor.kernels.cute.bwd_results import (  # noqa: E402
    dbias_of,
    dq_fragments_as_rows,
    dq_of_fragments,
    dq_of_sums,
)
from gdpa_inductor.kernels.cute.dbias_plan import dbias_sums_for, preferred_dbias_sums  # noqa: E402
from gdpa_inductor.kernels.cute.gdpa_bwd import dbias_buffer, gdpa_bwd_cute, plan_dense_bwd  # noqa: E402
from gdpa_inductor.kernels.cute.kernel_args import bias_tile_modes, tma_bias  # noqa: E402


@pytest.mark.parametrize(
    "num_keys, sums",
    [(1, "in_place"), (128, "in_place"), (129, "in_place"), (1024, "in_place"), (1025, "fp32"), (1153, "fp32"),
     (2048, "fp32"), (2049, "fp32"), (4096, "fp32")],
)
def test_dq_sums_by_key_tiles(num_keys, sums):
    assert dq_sums_for(num_keys) == sums


@pytest.mark.parametrize("num_keys", range(1, 4200, 37))
def test_dq_sums_never_past_eight_roundings_in_place(num_keys):
    """The default never takes more than eight roundings in place."""
    tiles = -(-num_keys // 128)
    sums = dq_sums_for(num_keys)
    assert sums in ("in_place", "fp32")
    assert sums == "fp32" or tiles <= 8


@pytest.mark.parametrize("num_keys, sums", [(1, "in_place"), (512, "in_place"), (513, "fp32"), (1024, "fp32")])
def test_wide_head_dq_sums_count_64_key_tiles(num_keys, sums):
    """Past head dims of 128 the CTAs hold 64 keys, so in place stops at 512 keys (eight roundings)."""
    assert bwd_key_tile(256, 128) == bwd_key_tile(64, 256) == WIDE_KEY_TILE == 64
    assert bwd_key_tile(128, 128) == bwd_key_tile(96, 64) == 128
    assert dq_sums_for(num_keys, WIDE_KEY_TILE) == sums


@pytest.mark.parametrize("shape", [(3, 4, 40, 48), (1, 4, 40, 48), (3, 1, 40, 48), (4, 40, 48), (40, 48),
                                   (1, 1, 40, 48)])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu"])
def test_dbias_sums_the_ds_buffer_over_the_bias_broadcast_dims(shape, activation):
    """dbias from the kernel's [Z, H, Nq, Nk] dS buffer: summed over every dim the bias broadcasts along (leading
    dims it lacks included, as a varlen batch's [H, N, N] position bias), in its shape, scaled by post_scale and
    the activation form's constant factor, which the kernel's dS leaves out."""
    ds = torch.randn(3, 4, 40, 48, dtype=torch.float64)
    factor = 0.7 * backward_form(activation).grad_factor
    want = (ds * factor).sum_to_size((1,) * (4 - len(shape)) + shape).reshape(shape)
    got = dbias_of(ds.clone(), torch.empty(shape, dtype=torch.float64), "buffer", activation, 0.7)
    assert got.shape == shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(4, 40, 48), (2, 1, 40, 48), (40, 48)])
def test_bias_tile_modes_of_fewer_dims(shape):
    """A bias with fewer than four dims (a varlen batch's [H, N, N]) reaches the kernel in its (Nq, Nk, Hb, Zb) modes,
    its dims of one given a stride TMA takes (a multiple of 16 bytes)."""
    bias = torch.randn(shape, dtype=torch.bfloat16)
    modes = bias_tile_modes(bias)
    full = (1,) * (4 - len(shape)) + shape
    assert modes.shape == (full[2], full[3], full[1], full[0])
    assert torch.equal(modes.permute(3, 2, 0, 1).reshape(shape), bias)
    assert modes.stride(1) == 1 and all(s * 2 % 16 == 0 for i, s in enumerate(modes.stride()) if i != 1)


@pytest.mark.parametrize("shape", [(3, 4, 40, 48), (1, 4, 40, 48), (3, 1, 40, 48), (4, 40, 48), (40, 48),
                                   (1, 1, 40, 48)])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "relu"])
def test_dbias_from_the_atomic_sums(shape, activation):
    """dbias from the kernel's fp32 sums ([Zb, Hb, columns padded to 128, rows padded to 64], transposed so that two
    neighbouring queries are one add): the bias's rows and columns cut out of the padding, transposed back, scaled by
    post_scale and the activation form's constant factor, rounded once to the bias's dtype, in its shape."""
    bias = torch.empty(shape, dtype=torch.bfloat16)
    sums = dbias_buffer("atomic", 3, 4, bias, zeros=True)
    full = (1,) * (4 - len(shape)) + shape
    assert sums.shape == (*full[:2], 128, 64) and sums.dtype == torch.float32 and not sums.any()
    sums.normal_(generator=torch.Generator().manual_seed(len(shape)))
    factor = 0.7 * backward_form(activation).grad_factor
    # scaled in fp32, then one rounding to bf16 (a float64 product rounded twice can differ in the last bit)
    want = (sums[..., :48, :40].transpose(-1, -2) * factor).to(torch.bfloat16).reshape(shape)
    got = dbias_of(sums, bias, "atomic", activation, 0.7)
    assert got.shape == shape and got.dtype == torch.bfloat16 and got.is_contiguous()
    assert torch.equal(got, want)


@pytest.mark.parametrize("sums", ["buffer", "atomic"])
@pytest.mark.parametrize("zb, hb", [(3, 4), (1, 4), (3, 1), (1, 1)])
@pytest.mark.parametrize("one_row", [True, False])
def test_dbias_of_one_row_bias_sums_its_rows(sums, zb, hb, one_row):
    """A bias of one row for every query seen as Nq rows of stride 0 (``bias_4d``) gets its one row's gradient: the
    scaled dS summed over the queries too (over the broadcast dims as any bias), in its [Zb, Hb, 1, Nk] shape. A
    bias its caller expanded to Nq rows itself (the same stride-0 view) gets a gradient per row."""
    bias = torch.randn(zb, hb, 1, 48, dtype=torch.float64).expand(zb, hb, 40, 48)
    gen = torch.Generator().manual_seed(zb * 10 + hb)
    factor = 0.7 * backward_form("silu").grad_factor
    if sums == "buffer":
        ds = torch.randn(3, 4, 40, 48, dtype=torch.float64, generator=gen)
        want = (ds * factor).sum_to_size(zb, hb, 1 if one_row else 40, 48)
    else:
        ds = dbias_buffer("atomic", 3, 4, bias, zeros=True)
        ds[..., :48, :40] = torch.randn(zb, hb, 48, 40, generator=gen)
        ds[..., 48:, :] = float("nan")
        want = ds[..., :48, :40].transpose(-1, -2) * factor
        want = want.sum(-2, keepdim=True) if one_row else want
    got = dbias_of(ds, bias, sums, "silu", 0.7, one_row)
    assert got.shape == (zb, hb, 1 if one_row else 40, 48) and got.is_contiguous()
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "sigmoid", "relu"])
def test_dq_from_its_fp32_sums(dtype, activation):
    """dQ from the kernel's fp32 sums, which it leaves unscaled: times dS's scale (scale, post_scale and the activation
    form's constant factor, multiplied in fp32 as the kernel multiplies them for dK), rounded once to the operands'
    dtype: within one unit in the last place of the exact product (half of one, plus the fp32 product's rounding)."""
    sums = torch.randn(2, 3, 50, 64, generator=torch.Generator().manual_seed(5))
    scale, post = 96**-0.5, 1 / 777
    f32 = torch.float32
    factor = torch.tensor(scale, dtype=f32) * torch.tensor(post, dtype=f32) * backward_form(activation).grad_factor
    got = dq_of_sums(sums, dtype, activation, scale, post)
    assert got.dtype == dtype and got.shape == sums.shape
    assert torch.equal(got, (sums * factor).to(dtype))
    exact = sums.double() * scale * post * backward_form(activation).grad_factor
    info = torch.finfo(dtype)
    ulp = (2.0 ** torch.floor(torch.log2(exact.abs())) * info.eps).clamp(min=info.smallest_normal * info.eps)
    assert ((got.double() - exact).abs() <= ulp).all()


@pytest.mark.parametrize("shape, samples, varlen, way", [
    ((1, 4, 512, 512), 1152, True, "atomic"), ((4, 512, 512), 1152, True, "atomic"), ((512, 512), 8, True, "atomic"),
    ((1152, 1, 512, 512), 1152, True, "buffer"), ((1152, 4, 512, 512), 1152, True, "buffer"),
    ((1, 4, 512, 512), 1, True, "buffer"),
    ((1, 4, 512, 512), 1152, False, "buffer"), ((1152, 1, 512, 512), 1152, False, "buffer"),
])
def test_dbias_sums_atomic_for_varlen_biases_shared_by_samples(shape, samples, varlen, way):
    """dbias is added atomically for a varlen batch's bias shared by its samples (HSTU's relative bias; measured
    faster), stored into the dS buffer otherwise (a dense batch's: measured level or faster; a bias per sample)."""
    assert preferred_dbias_sums(torch.Size(shape), samples, varlen) == way
    bias = torch.zeros(shape, dtype=torch.bfloat16)
    assert dbias_sums_for(samples, 4, bias, varlen, spare=2**50) == (way, "")


BUFFER = 1152 * 4 * 512 * 512 * 2
ATOMIC = 4 * 512 * 512 * 4


@pytest.mark.parametrize("varlen, spare, way", [
    (False, 2 * BUFFER, "buffer"), (False, 2 * BUFFER - 1, "atomic"), (False, 2 * ATOMIC, "atomic"),
    (False, 2 * ATOMIC - 1, None),
    (True, 2 * ATOMIC, "atomic"), (True, 2 * ATOMIC - 1, None),
])
def test_dbias_sums_within_half_the_spare_memory(varlen, spare, way):
    """The CuTe backward takes dbias only where the tensor it sums it in needs at most half of what the device can
    still allocate: its preferred way, else the other; where neither fits the reason gives every size."""
    bias = torch.zeros(4, 512, 512, dtype=torch.bfloat16)
    got, why = dbias_sums_for(1152, 4, bias, varlen, spare)
    assert got == way
    assert way or ("tensors for dbias" in why and "atomic 0.0 GiB" in why and "buffer 2.2 GiB" in why), why


def test_atomic_sums_pad_rows_and_columns_to_whole_tiles():
    """The kernel adds whole (128 keys x 64 queries) tiles, past the bias's ends too (zeros there): the sums are
    padded to whole tiles, so that no add lands outside them."""
    bias = torch.zeros(2, 1, 65, 129, dtype=torch.float16)
    assert dbias_buffer("atomic", 2, 4, bias, zeros=False).shape == (2, 1, 256, 128)
    ds = dbias_buffer("buffer", 2, 4, bias, zeros=False)
    assert ds.shape == (2, 4, 65, 129) and ds.stride(-2) == 136


@pytest.mark.parametrize("shape, view, copied", [
    ((2, 4, 40, 48), None, False), ((2, 4, 40, 300), None, True), ((1, 1, 40, 512), slice(6, 306), True),
    ((1, 1, 40, 512), slice(8, 304), False), ((2, 1, 1, 300), "rows", True), ((2, 1, 1, 296), "rows", False)])
def test_tma_bias_copies_only_what_tma_cannot_read(shape, view, copied):
    """A bias TMA can load in place (Nk and its strides multiples of 8 values, 16-byte aligned) is itself; another is
    copied into rows padded to a multiple of 8, seen as its columns: the same values, strides TMA takes. A bias of one
    row seen as every query's (stride 0) copies its one row and stays a stride-0 view."""
    base = torch.randn(shape, dtype=torch.bfloat16)
    if view == "rows":
        bias = base.expand(*shape[:2], 40, shape[-1])
    elif view is not None:
        bias = base[..., view]
    else:
        bias = base
    got = tma_bias(bias)
    assert torch.equal(got, bias)
    assert (got.data_ptr() != bias.data_ptr()) == copied
    strides = [s for n, s in zip(got.shape[:-1], got.stride()[:-1]) if n > 1]
    assert got.stride(-1) == 1 and all(s % 8 == 0 for s in strides) and got.data_ptr() % 16 == 0
    if view == "rows":
        assert got.stride(-2) == 0
        assert got.untyped_storage().nbytes() == shape[0] * shape[1] * -(-shape[-1] // 8) * 8 * 2


def test_bias_gradient_needs_a_bias_tensor():
    q = torch.zeros(1, 1, 64, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bias_grad=True needs a bias tensor"):
        gdpa_bwd_cute(q, q, q, q, "silu", 1.0, 1.0, 0.01, bias=torch.tensor(0.5), bias_grad=True)


@pytest.mark.parametrize(
    "sums, d, dv, late",
    [("in_place", 128, 128, False), ("fp32", 128, 128, True), ("in_place", 64, 64, True),
     ("in_place", 96, 96, True), ("in_place", 128, 64, True), ("in_place", 64, 128, True)],
)
def test_dq_one_tile_late_except_in_place_at_128(sums, d, dv, late):
    """The warpgroups meet every tile only where that measured faster: dQ summed in place at D = Dv = 128."""
    assert dq_late_for(sums, d, dv) is late


@pytest.mark.parametrize("num_queries", [80, 170, 240])
def test_dq_fragments_as_rows_undoes_the_accumulator_order(num_queries):
    """The 80-row backward's fp32 sums, in its accumulators' order (built one thread and value at a time from the
    wgmma layout), viewed back as rows of D: every value in its place, the padded rows included."""
    rows = -(-num_queries // LONG_QUERY_TILE) * LONG_QUERY_TILE
    dq = torch.randn(2, 3, rows, 128, generator=torch.Generator().manual_seed(7))
    assert torch.equal(dq_fragments_as_rows(wgmma_fragments_of(dq, LONG_QUERY_TILE)), dq)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dq_of_fragments_scales_and_rounds_once(dtype):
    dq = torch.randn(1, 2, 240, 128, generator=torch.Generator().manual_seed(8))
    got = dq_of_fragments(wgmma_fragments_of(dq, LONG_QUERY_TILE), 170, dtype, "gelu_tanh", 0.125, 1 / 777)
    factor = torch.tensor(0.125) * torch.tensor(1 / 777) * backward_form("gelu_tanh").grad_factor
    assert got.shape == (1, 2, 170, 128) and got.dtype == dtype
    assert torch.equal(got, (dq[:, :, :170] * factor).to(dtype))


def _tile_case(activation, num_queries, dq_sums="fp32", head_dim=128, causal=False, score_bias=False, packed=False):
    return (dq_sums, head_dim, head_dim, causal, score_bias, activation, num_queries, packed)


@pytest.mark.parametrize("env, case, tile", [
    (None, _tile_case("silu", 2048), 80), (None, _tile_case("relu", 4096), 80),
    (None, _tile_case("hardswish", 2048), 80), (None, _tile_case("silu", 2047), 64),
    (None, _tile_case("gelu_tanh", 2048), 64), (None, _tile_case("sigmoid", 4096), 64),
    (None, _tile_case("gelu_tanh", 2048, packed=True), 80), (None, _tile_case("gelu_tanh", 2047, packed=True), 64),
    (None, _tile_case("gelu_tanh", 4096, dq_sums="in_place", packed=True), 64),
    (None, _tile_case("silu", 2048, dq_sums="in_place"), 64), (None, _tile_case("silu", 2048, causal=True), 64),
    (None, _tile_case("relu", 2048, score_bias=True), 64), (None, _tile_case("silu", 2048, head_dim=96), 64),
    ("80", _tile_case("silu", 100), 80), ("80", _tile_case("gelu_tanh", 100), 80),
    ("80", _tile_case("silu", 100, dq_sums="in_place"), 64), ("80", _tile_case("silu", 100, head_dim=64), 64),
    ("80", _tile_case("silu", 100, causal=True), 64), ("80", _tile_case("silu", 100, score_bias=True), 64),
    ("80", _tile_case("gelu", 100), 64), ("64", _tile_case("silu", 2048), 64),
])
def test_query_tile_of_80_rows_by_default_in_its_measured_cases_or_on_request(monkeypatch, env, case, tile):
    monkeypatch.setattr(gdpa_inductor.config, "cute_bwd_query_tile", None if env is None else int(env))
    assert bwd_query_tile(*case) == tile


BF16, FP16 = torch.bfloat16, torch.float16


@pytest.mark.parametrize("dtype, activation, head_dims, offset, bias, packed", [
    (BF16, "gelu_tanh", (128, 128), False, False, True), (BF16, "gelu_tanh", (64, 96), False, False, True),
    (FP16, "gelu_tanh", (128, 128), False, False, False), (BF16, "silu", (128, 128), False, False, False),
    (BF16, "gelu_tanh", (256, 256), False, False, False), (BF16, "gelu_tanh", (128, 256), False, False, False),
    (BF16, "gelu_tanh", (128, 128), True, False, False), (BF16, "gelu_tanh", (128, 128), False, True, False),
])
def test_packed_backward_form_for_bf16_gelu_tanh_without_bias_in_narrow_heads(dtype, activation, head_dims, offset,
                                                                             bias, packed):
    assert packed_backward(dtype, activation, *head_dims, offset, bias) is packed


@pytest.mark.parametrize("dq_sums, d, dv, varlen, rounds", [
    ("fp32", 128, 128, False, True), ("fp32", 64, 64, False, True), ("fp32", 96, 64, False, True),
    ("in_place", 128, 128, False, False), ("fp32", 128, 128, True, False),
    ("fp32", 256, 128, False, False), ("fp32", 64, 256, False, False),
])
def test_dq_rounded_in_the_kernel_where_it_sums_in_fp32_in_a_dense_batch(dq_sums, d, dv, varlen, rounds):
    """The last CTA of each head rounds dQ wherever the kernel sums it in fp32 at D, Dv <= 128 in a dense batch (the
    varlen launcher sums its per-sample buffer itself; the wide-head kernel has no such path)."""
    assert dq_last_round_for(dq_sums, d, dv, varlen) is rounds


@pytest.mark.parametrize("rounds", [True, False])
def test_dq_sums_from_the_kept_workspace_where_the_kernel_rounds_dq(monkeypatch, rounds):
    """With ``dq_last_round`` the launcher hands the kernel the workspace's zeroed sums and counts (the kernel leaves
    them zero: here a stand-in does), the same buffer call after call; otherwise a fresh zeroed buffer each time."""
    from gdpa_inductor.kernels.cute import gdpa_bwd
    from gdpa_inductor.kernels.cute.dq_workspace import release_dq_workspaces

    seen = []

    def kernel(q, k, v, do, sums, dk, dv, *rest):
        counts = rest[-1]
        dq_out = rest[-2]
        assert not sums.any() and (counts is None or not counts.any())
        # the tensor itself, so that a freed buffer's memory cannot come back as the next call's
        seen.append(sums)
        if rounds:
            dq_out.copy_(q)
            counts.zero_()
        else:
            sums.copy_(q)
        dk.zero_()
        dv.zero_()

    monkeypatch.setattr(gdpa_bwd, "compile_bwd", lambda *a, **kw: kernel)
    release_dq_workspaces()
    q, k, v, do = (torch.randn(1, 2, 192, 64, dtype=torch.bfloat16) for _ in range(4))
    # 192 keys sum dQ in place by default: fp32 sums asked for
    plan = dataclasses.replace(plan_dense_bwd(q, k, v, "silu"), dq_sums="fp32", dq_last_round=rounds)
    try:
        for _ in range(2):
            dq = gdpa_bwd_cute(q, k, v, do, "silu", 1.0, 1.0, 0.01, plan=plan)[0]
            assert torch.equal(dq, q) if rounds else dq.shape == q.shape
        assert (seen[0].data_ptr() == seen[1].data_ptr()) is rounds
    finally:
        release_dq_workspaces()
