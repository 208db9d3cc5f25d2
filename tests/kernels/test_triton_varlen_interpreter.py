"""The Triton varlen kernels under TRITON_INTERPRET=1 (fp32 and fp16; the interpreter gets bf16 wrong)
against the independent float64 oracle: every layout, causal and windows (the tile bounds of
``varlen_bounds`` are exercised by lengths around the tile sizes), GQA, Dv != D, odd head dims, empty
samples, forward and every gradient."""

from __future__ import annotations

import pytest
import torch
from gdpa_testing import rel_err, requires_interpreter
from varlen_testing import LAYOUTS, MASKS, bias_for, make_case, oracle

from gdpa_inductor import config, gdpa_varlen

pytestmark = requires_interpreter

PARAMS = dict(activation="gelu_tanh", scale=0.25, post_scale=0.7)


@pytest.fixture(autouse=True)
def _triton_path():
    saved = config.backend
    config.backend = "triton"
    yield
    config.backend = saved


def run_both(case, dtype, bias=None, **params):
    """(out, dq, dk, dv[, dbias]) of the op in ``dtype`` and of the float64 oracle."""
    params = PARAMS | params
    q64, k64, v64 = case.inputs(torch.float64)
    b64 = [] if bias is None else [bias.detach().double().requires_grad_()]
    want = oracle(case, **params)(q64, k64, v64, *b64)
    dout = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want_grads = torch.autograd.grad(want, (q64, k64, v64, *b64), dout)
    q, k, v = case.inputs(dtype)
    b = [] if bias is None else [bias.detach().to(dtype).requires_grad_()]
    got = gdpa_varlen(q, k, v, **case.kwargs, **params, bias=b[0] if b else None)
    got_grads = torch.autograd.grad(got, (q, k, v, *b), dout.to(dtype))
    return (got, *got_grads), (want, *want_grads)


def eager_half(case, dtype, **params):
    """The oracle's own math in the half dtype (eager's error at this shape)."""
    params = PARAMS | params
    q, k, v = case.inputs(dtype)
    out = oracle(case, **params)(q, k, v)
    dout = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    return (out, *torch.autograd.grad(out, (q, k, v), dout.to(dtype)))


@pytest.mark.parametrize("mask", ["none", "hstu"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp32_layouts(layout, mask, gen):
    causal, window = MASKS[mask]
    got, want = run_both(make_case(layout, gen), torch.float32, causal=causal, window=window)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert rel_err(a, b) <= 1e-5, f"{name}: {rel_err(a, b):.3g}"


@pytest.mark.parametrize("mask", ["causal", "window", "left_only"])
def test_fp32_masks_across_tiles(mask, gen):
    """Sequences of 70-130 rows: several 16-64 row tiles, so masked head, complete middle and masked tail
    loops all run."""
    causal, window = MASKS[mask]
    window = tuple(w * 9 if w is not None else None for w in window) if window else None
    case = make_case("cross", gen, h=2, hkv=1, d=32, dv=16, lq=[70, 130, 0, 96], lk=[128, 75, 33, 96])
    got, want = run_both(case, torch.float32, causal=causal, window=window)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert rel_err(a, b) <= 1e-5, f"{name}: {rel_err(a, b):.3g}"


@pytest.mark.parametrize("d,dv", [(8, 8), (20, 24), (80, 40)])
def test_fp32_head_dims(d, dv, gen):
    got, want = run_both(make_case("self", gen, d=d, dv=dv), torch.float32, causal=True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert rel_err(a, b) <= 1e-5, f"{name}: {rel_err(a, b):.3g}"


@pytest.mark.parametrize("layout", ["cross", "pma"])
def test_fp16_within_twice_eager_error(layout, gen):
    case = make_case(layout, gen)
    got, want = run_both(case, torch.float16, causal=True, window=(6, 0))
    eager = eager_half(case, torch.float16, causal=True, window=(6, 0))
    for name, a, e, b in zip(("out", "dq", "dk", "dv"), got, eager, want):
        assert rel_err(a, b) <= 2 * rel_err(e, b) + 1e-6, f"{name}: {rel_err(a, b):.3g} vs eager {rel_err(e, b):.3g}"


@pytest.mark.parametrize("shared,grouped", [(True, False), (True, True), (False, False)],
                         ids=["shared_bias", "shared_bias_grouped_atomic", "per_sample_bias"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp32_bias_and_its_gradient(layout, shared, grouped, gen, monkeypatch):
    """A bias read at each sample's own positions, causal with a window, and dBias: one buffer slice per sample,
    or (a budget of one sample's slice) every sample adding into one slice with atomics. Two query heads on one kv
    head: each dK/dV program writes the dBias of both heads of its group (the kv heads' own indexing is
    test_fp32_layouts')."""
    from gdpa_inductor.kernels.triton import varlen_bwd

    if grouped:
        monkeypatch.setattr(varlen_bwd, "FULL_GRAD_BUFFER_BYTES", 1)
    case = make_case(layout, gen, h=2, hkv=1)
    got, want = run_both(case, torch.float32, bias=bias_for(case, gen, shared, h=2), causal=True, window=(6, 0))
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), got, want):
        assert a.shape == b.shape, name
        assert rel_err(a, b) <= 1e-5, f"{name}: {rel_err(a, b):.3g}"


@pytest.mark.parametrize("batch", [1, 5, 40])
@pytest.mark.parametrize("modes", [("jagged", "jagged"), ("full", "jagged"), ("jagged", "full"), ("padded", "padded"),
                                   ("cut", "cut")])
def test_schedule_kernel_matches_torch(modes, batch, gen, monkeypatch):
    """The one-launch schedule (rows of both sides, samples by decreasing work, ties in index order) equals
    the torch-op fallback, with many equal lengths and zeros (40 samples of six lengths per side, sorted in a block
    of 64 with a padded tail)."""
    from gdpa_inductor.kernels.triton import varlen_schedule

    lengths = [torch.randint(0, 6, (batch,), generator=gen, dtype=torch.int32) * 7 for _ in range(2)]
    args = []
    for mode, lens, heads in zip(modes, lengths, (4, 2)):
        total = int(lens.sum())
        if mode in ("jagged", "cut"):  # "cut": a jagged side with rows used, some past the length, one negative
            used = torch.randint(-1, 40, (batch,), generator=gen) if mode == "cut" else None
            args.append((torch.zeros(total, heads, 8), torch.cat([torch.zeros(1, dtype=torch.int32),
                                                                  lens.cumsum(0).to(torch.int32)]), used))
        else:
            dense = torch.zeros(1 if mode == "full" else batch, 35, heads, 8)
            args.append((dense, None, lens if mode == "padded" else None))
    (q, cu_q, used_q), (k, cu_k, used_k) = args
    call = (q, k, cu_q, cu_k, used_q, used_k, 35, 35, batch)
    qs, ks, order = varlen_schedule.varlen_sides(*call)
    monkeypatch.setattr(varlen_schedule, "MAX_SORT", 0)
    qt, kt, order_t = varlen_schedule.varlen_sides(*call)
    for a, b in ((qs.starts, qt.starts), (qs.lengths, qt.lengths), (ks.starts, kt.starts),
                 (ks.lengths, kt.lengths), (order, order_t)):
        assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize("on_kernel", [True, False])
@pytest.mark.parametrize("offsets", [[0, 5, 25, 30], [0, 12, 8, 30], [-3, 5, 40, 50], [2, 2, 9, 11]])
def test_schedule_clamps_offsets_and_cuts_lengths(offsets, on_kernel, monkeypatch):
    """int64 offsets as a graph has them: each start clamped to [0, rows], each length to [0, the longest], on the
    schedule kernel and on the torch ops alike (written out here, not compared with each other)."""
    from gdpa_inductor.kernels.triton import varlen_schedule

    if not on_kernel:
        monkeypatch.setattr(varlen_schedule, "MAX_SORT", 0)
    rows, longest = 30, 16
    cu = torch.tensor(offsets, dtype=torch.int64)
    x = torch.zeros(rows, 2, 8)
    qs, ks, order = varlen_schedule.varlen_sides(x, x, cu, cu, None, None, longest, longest, len(offsets) - 1)
    clamped = [min(max(o, 0), rows) for o in offsets]
    starts = clamped[:-1]
    lengths = [min(max(end - start, 0), longest) for start, end in zip(clamped[:-1], clamped[1:])]
    ranked = order.tolist()
    assert sorted(ranked) == list(range(len(starts)))
    assert [lengths[z] for z in ranked] == sorted(lengths, reverse=True)
    for side in (qs, ks):
        assert side.starts.tolist() == [starts[z] for z in ranked]
        assert side.lengths.tolist() == [lengths[z] for z in ranked]
