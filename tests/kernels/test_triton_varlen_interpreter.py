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
    """The one-launch schedule (rows of both sides, samples by decreasing work, ties in index order, the jagged
    sides' gap ends) equals the torch-op fallback, with many equal lengths and zeros (40 samples of six lengths per
    side, sorted in a block of 64 with a padded tail)."""
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
    *_, schedule = varlen_schedule.varlen_sides(*call)
    monkeypatch.setattr(varlen_schedule, "MAX_SORT", 0)
    *_, schedule_t = varlen_schedule.varlen_sides(*call)
    for side, jagged in (("Q", cu_q is not None), ("K", cu_k is not None)):
        if not jagged:  # a dense side's gap ends are never read
            for s in (schedule, schedule_t):
                s[getattr(varlen_schedule, f"GAP_END_{side}").value] = 0
    assert torch.equal(schedule, schedule_t), (schedule, schedule_t)


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
    qs, ks, schedule = varlen_schedule.varlen_sides(x, x, cu, cu, None, None, longest, longest, len(offsets) - 1)
    clamped = [min(max(o, 0), rows) for o in offsets]
    starts = clamped[:-1]
    lengths = [min(max(end - start, 0), longest) for start, end in zip(clamped[:-1], clamped[1:])]
    decreasing = any(end < start for start, end in zip(clamped[:-1], clamped[1:]))
    gap_ends = [-1 if decreasing else end for end in clamped[1:-1] + [rows]]
    ranked = varlen_schedule.row(schedule, varlen_schedule.ORDER).tolist()
    assert sorted(ranked) == list(range(len(starts)))
    assert [lengths[z] for z in ranked] == sorted(lengths, reverse=True)
    for side in (qs, ks):
        assert side.starts.tolist() == [starts[z] for z in ranked]
        assert side.lengths.tolist() == [lengths[z] for z in ranked]
    for which in (varlen_schedule.GAP_END_Q, varlen_schedule.GAP_END_K):
        assert varlen_schedule.row(schedule, which).tolist() == [gap_ends[z] for z in ranked]


def test_schedule_of_no_samples():
    """Offsets of one entry: no sample, an empty schedule of every row."""
    from gdpa_inductor.kernels.triton import varlen_schedule

    x = torch.zeros(0, 2, 8)
    cu = torch.zeros(1, dtype=torch.int64)
    *_, schedule = varlen_schedule.varlen_sides(x, x, cu, cu, None, None, 4, 4, 0)
    assert schedule.shape == (varlen_schedule.SCHEDULE_ROWS, 0)


@pytest.mark.parametrize("offsets,used", [([0, 5, 25, 30], None), ([3, 5, 25, 27], None), ([0, 10, 3, 3], None),
                                          ([0, 12, 8, 30], None), ([2, 9, 20, 30], [7, 3, 40])],
                         ids=["full", "gaps", "decreasing_apart", "decreasing_overlap", "used"])
def test_backward_zeroes_the_rows_no_sample_reads(offsets, used, monkeypatch):
    """Jagged gradients start as uninitialised memory (NaN here): the rows before the first sample, after a
    sample cut to the longest or to its rows used, and after the last read as zero, every other row as the float64
    reference has it; where offsets decrease, every row no sample reads is zero too."""
    from gdpa_inductor.kernels.reference_varlen import gdpa_varlen_reference

    real_empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda x, **kw: real_empty_like(x, **kw).fill_(float("nan")))
    rows, longest = 30, 16
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(rows, 2, 8, generator=gen) for _ in range(3))
    cu = torch.tensor(offsets, dtype=torch.int32)
    used_t = torch.tensor(used, dtype=torch.int32) if used is not None else None
    # the op as a compiled graph calls it: offsets as they come, no checks
    args = (None, cu, cu, used_t, used_t, longest, longest, "silu", 0.3, 0.5, True, -1, -1, 0.01)
    clamped = [min(max(o, 0), rows) for o in offsets]
    ok = all(a <= b for a, b in zip(clamped[:-1], clamped[1:]))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = torch.ops.gdpa.varlen_fwd_v2(*leaves, *args)
    dout = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out = gdpa_varlen_reference(*ref_leaves, *args[:-3], (-1, -1), 0.01)
    want = torch.autograd.grad(ref_out, ref_leaves, dout.double())
    read = torch.zeros(rows, dtype=torch.bool)
    for z in range(len(offsets) - 1):
        n = max(0, min(clamped[z + 1] - clamped[z], longest, *([max(used[z], 0)] if used else [])))
        read[clamped[z]:clamped[z] + n] = True
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert bool((a[~read] == 0).all()), name
        if ok:
            assert rel_err(a, b) <= 1e-5, f"{name}: {rel_err(a, b):.3g}"
