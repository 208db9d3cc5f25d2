"""The varlen forward on sm_100 (``lowering/sm100_varlen_forward.py``), taken as the dense one is: the CuTe Blackwell
forward serves a call only once the build it would run (its causal mask, window, bias) has passed its first-use
self-check against Triton's varlen forward; a build that mismatches, raises or fails to compile is disabled with one
warning and its calls run on Triton. Here CPU tensors stand in for an sm_100 GPU's, a stand-in for the Blackwell
varlen launcher is right or wrong on purpose (everywhere, or only where a mask or a bias acts, or only in the last
sample), and the reference, sample by sample over the launchers' sides, stands in for Triton's varlen forward."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from gdpa_inductor.kernels.cute import fwd_support, varlen_support
from gdpa_inductor.kernels.cute.varlen_fwd import plan_varlen_fwd_sm100
from gdpa_inductor.kernels.reference import gdpa_reference
from gdpa_inductor.kernels.reference_varlen import gdpa_varlen_reference
from gdpa_inductor.kernels.triton.varlen_schedule import ORDER, row
from gdpa_inductor.lowering import (
    direct_launch,
    self_check,
    sm100_kernels,
    sm100_varlen_forward,
    varlen_ops,
)
from gdpa_inductor.lowering.dispatch import select_varlen_forward_impl
from gdpa_inductor.lowering.sm100_forward_cases import WINDOWS
from gdpa_inductor.lowering.sm100_varlen_forward import varlen_forward_check

pytestmark = pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")


def _rows_of(side, x, rank: int, z: int):
    """Sample ``z``'s rows (at ``rank`` in the sides' order) of ``x``, laid out like ``side``'s tensor."""
    start, n = int(side.starts[rank]), int(side.lengths[rank])
    return (slice(start, start + n),) if side.jagged else (z if x.shape[0] > 1 else 0, slice(start, start + n))


def _on_sides(qs, ks, v, bias, out, order, activation, scale, post_scale, causal, window, slope, exact: bool,
              spoil=None):
    """The reference, sample by sample, over the launchers' sides, into ``out.tensor``: in float64 rounded to the
    operands' dtype where ``exact``, else in their dtype; ``spoil(z)``: a fault, (causal, window, keep the bias,
    scale the sample by) for sample z."""
    full = (qs.batch, qs.tensor.shape[-2], qs.max_len, ks.max_len)
    b4 = None if bias is None else bias.expand(full)
    for rank in range(qs.batch):
        z = int(order[rank])
        nq, nk = int(qs.lengths[rank]), int(ks.lengths[rank])
        if not (nq and nk):
            continue
        qi, ki = _rows_of(qs, qs.tensor, rank, z), _rows_of(ks, ks.tensor, rank, z)
        qz, kz, vz = (x[i].transpose(0, 1) for x, i in ((qs.tensor, qi), (ks.tensor, ki), (v, ki)))
        bz = None if b4 is None else b4[z, :, :nq, :nk]
        c, w, keep_bias, factor = spoil(z) if spoil else (causal, window, True, 1.0)
        if exact:
            qz, kz, vz = qz.double(), kz.double(), vz.double()
            bz = None if bz is None else bz.double()
        oz = gdpa_reference(qz, kz, vz, bz if keep_bias else None, activation, scale, post_scale, c, slope,
                            window=w)
        out.tensor[_rows_of(qs, out.tensor, rank, z)] = (oz * factor).transpose(0, 1).to(out.tensor.dtype)
    return out.tensor


class VarlenStandIn:
    """Stands in for ``gdpa_varlen_fwd_cute_sm100``: the forward's math, spoiled by ``fault``; records the plans."""

    def __init__(self, fault: str):
        self.fault, self.plans, self.grids = fault, [], []

    def __call__(self, qs, ks, v, out, order, activation, scale, post_scale, negative_slope, causal=False,
                 window=(-1, -1), bias=None, plan=None, ctas=None):
        self.plans.append(plan)
        self.grids.append(ctas)
        if self.fault == "raises on compile":
            raise RuntimeError("DSLRuntimeError: the kernel did not compile (stand-in)")
        last = qs.batch - 1
        left, right = window

        def spoil(z):
            return {
                "mask ignored": (False, (-1, -1), True, 1.0),
                "window one key wider on the left": (causal, (left + 1 if left >= 0 else left, right), True, 1.0),
                "bias ignored": (causal, window, False, 1.0),
                "last sample times 1.02": (causal, window, True, 1.02 if z == last else 1.0),
                "times 1.01": (causal, window, True, 1.01),
            }.get(self.fault, (causal, window, True, 1.0))

        o = _on_sides(qs, ks, v, bias, out, order, activation, scale, post_scale, causal, window, negative_slope,
                      exact=True, spoil=spoil)
        if self.fault == "one NaN":
            o.view(-1)[0] = float("nan")
        return o


class Triton:
    """Stands in for ``gdpa_varlen_fwd_triton``: the reference in the operands' dtype; counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, qs, ks, v, bias, out, schedule, activation, scale, post_scale, causal, window, negative_slope,
                 config=None, traced=False):
        self.calls += 1
        _on_sides(qs, ks, v, bias, out, row(schedule, ORDER), activation, scale, post_scale, causal, window,
                  negative_slope, exact=False)


@pytest.fixture
def sm100(monkeypatch, sm100_machine):
    """CPU tensors as an sm_100 GPU's with the CuTe stack and Triton (the sides scheduled by PyTorch); returns
    ``install(fault)``, which puts a Blackwell varlen stand-in in place, the Triton stand-in, and the variants
    checked."""
    triton = Triton()
    monkeypatch.setattr("gdpa_inductor.kernels.triton.varlen_fwd.gdpa_varlen_fwd_triton", triton)

    def install(fault: str) -> VarlenStandIn:
        kernel = VarlenStandIn(fault)
        monkeypatch.setattr("gdpa_inductor.kernels.cute.varlen_fwd.gdpa_varlen_fwd_cute_sm100", kernel)
        return kernel

    return install, triton, sm100_machine


# the calls' features: (causal, window, kind of bias)
FEATURES = {
    "plain": (False, (-1, -1), None),
    "causal": (True, (-1, -1), None),
    "a window": (False, (20, 5), None),
    "causal in a window": (True, (30, -1), None),
    "a bias in the operands' dtype": (False, (-1, -1), "bf16"),
    "an fp32 bias": (False, (-1, -1), "fp32"),
    "one element": (False, (-1, -1), "one element"),
    "causal, a window and a bias": (True, (40, 3), "bf16"),
}


def _call(gen, feature, d=64, dtype=torch.bfloat16):
    """The varlen op's arguments of a jagged call with the build's ``feature``: three samples, one empty."""
    causal, window, kind = FEATURES[feature]
    cu_q = torch.tensor([0, 90, 90, 150], dtype=torch.int32)
    cu_k = torch.tensor([0, 120, 120, 170], dtype=torch.int32)
    q = torch.randn(150, 4, d, generator=gen).to(dtype)
    k, v = (torch.randn(170, 2, d, generator=gen).to(dtype) for _ in range(2))
    shape, bias_dtype = {None: (None, None), "bf16": ((3, 4, 90, 120), dtype), "fp32": ((90, 120), torch.float32),
                         "one element": ((), dtype)}[kind]
    bias = None if shape is None else torch.randn(shape, generator=gen).to(bias_dtype)
    return (q, k, v, bias, cu_q, cu_k, None, None, 90, 120, "silu", d**-0.5, 1.0, causal, window[0], window[1], 0.01)


def _select(args):
    q, k, v, bias, cu_q, cu_k, used_q, used_k, _, _, activation, _, _, causal, left, right, _ = args
    return select_varlen_forward_impl(q, k, v, bias, causal, (left, right), activation, (cu_q, cu_k, used_q, used_k))


def _expected(args):
    return gdpa_varlen_reference(*args[:14], (args[14], args[15]), args[16])


def _cases(plan) -> list[tuple]:
    return list(varlen_forward_check(plan, torch.device("cpu")).cases())


@pytest.mark.parametrize("feature", FEATURES)
def test_a_correct_build_serves_after_one_check(sm100, gen, feature):
    install, triton, checks = sm100
    kernel = install("none")
    args = _call(gen, feature)
    for _ in range(3):
        assert _select(args) == "cute"
        out = varlen_ops.forward_impl(*args)
        assert len(checks) == 1
    plan = kernel.plans[-1]
    causal, window, kind = FEATURES[feature]
    assert set(kernel.plans) == {plan} and plan.varlen and plan.window == (window != (-1, -1))
    assert plan.causal == (causal and window == (-1, -1))
    assert plan.bias == {None: "", "bf16": "bfloat16"}.get(kind, "float32")
    assert len(kernel.plans) == len(_cases(plan)) + 3 and triton.calls == len(_cases(plan))
    torch.testing.assert_close(out, _expected(args), atol=2e-2, rtol=2e-2)
    assert "the CuTe Blackwell forward (bfloat16, D=64, silu" in checks[0] and "varlen" in checks[0]
    # the check runs few CTAs, each walking several tiles; the served calls take the device's grid
    assert kernel.grids == [sm100_kernels.CHECK_CTAS] * len(_cases(plan)) + [None] * 3


@pytest.mark.parametrize("causal, window, bias", [(False, (-1, -1), ""), (True, (-1, -1), "float32"),
                                                  (False, (5, 5), "bfloat16")])
def test_the_check_exercises_exactly_the_builds_features(causal, window, bias):
    """The check's inputs: jagged sides (two offsets tensors, and one for both) and padded ones, an empty sample,
    lengths ending part-way through 128-row tiles; the causal mask at Nq != Nk and Nq == Nk; under a window build
    both sides bounded, the left only under the causal mask, the right only; every kind of bias the build takes,
    random and none zero; no mask or bias where the build has none."""
    plan = dataclasses.replace(plan_varlen_fwd_sm100(torch.bfloat16, 64, "silu", causal, window, None), bias=bias)
    cases = _cases(plan)
    lengths = []
    for _, _, _, b, cu_q, cu_k, used_q, used_k, *_, c, w, _ in cases:
        q_lens = (cu_q.diff() if cu_q is not None else used_q).tolist()
        k_lens = (cu_k.diff() if cu_k is not None else used_k).tolist()
        lengths.append((q_lens, k_lens, cu_q is not None and cu_q is cu_k))
        assert (c, w) in (WINDOWS if plan.window else [(causal, (-1, -1))])
        assert (b is None) == (not bias) and (b is None or b.numel() == 1 or bool((b != 0).all()))
    assert any(0 in q and 0 in k for q, k, _ in lengths)
    assert all(n % 128 for q, k, _ in lengths for n in q + k if n)
    assert any(q != k for q, k, _ in lengths) and any(same for *_, same in lengths)
    assert any(cu is None for _, _, _, _, cu, *_ in cases)
    if plan.window:
        assert {w for *_, w, _ in cases} == {w for _, w in WINDOWS}
    if bias:
        dtypes = {c[3].dtype for c in cases}
        assert dtypes == ({torch.float32, torch.bfloat16} if bias == "float32" else {torch.bfloat16})
        assert any(c[3].dim() == 4 and c[3].shape[1] > 1 for c in cases)
        assert any(c[3].dim() < 4 or c[3].shape[1] == 1 for c in cases)


# a build's feature, a fault of the Blackwell stand-in, and what the warning says
WRONG = [
    ("plain", "times 1.01", "relative error to Triton's is"),
    ("plain", "last sample times 1.02", "relative error to Triton's is"),
    ("plain", "one NaN", "NaN or Inf where Triton's has not"),
    ("plain", "raises on compile", "raised RuntimeError: DSLRuntimeError"),
    ("causal", "mask ignored", "relative error to Triton's is"),
    ("a window", "window one key wider on the left", "relative error to Triton's is"),
    ("causal in a window", "mask ignored", "relative error to Triton's is"),
    ("a bias in the operands' dtype", "bias ignored", "relative error to Triton's is"),
    ("an fp32 bias", "bias ignored", "relative error to Triton's is"),
    ("one element", "bias ignored", "relative error to Triton's is"),
    ("causal, a window and a bias", "last sample times 1.02", "relative error to Triton's is"),
]


@pytest.mark.parametrize("feature, fault, why", WRONG)
def test_a_wrong_build_is_disabled_and_its_calls_run_triton(sm100, gen, caplog, feature, fault, why):
    install, triton, checks = sm100
    kernel = install(fault)
    args = _call(gen, feature)
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        for _ in range(2):
            assert _select(args) == "triton"
            out = varlen_ops.forward_impl(*args)
            torch.testing.assert_close(out, _expected(args), atol=2e-2, rtol=2e-2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and len(checks) == 1
    assert "the CuTe Blackwell forward (bfloat16, D=64, silu" in warnings[0] and why in warnings[0]
    assert "varlen" in warnings[0] and "disabled for this process" in warnings[0]
    assert len(kernel.plans) <= len(_cases(kernel.plans[0]))
    assert triton.calls == 2 + len(kernel.plans) - (fault == "raises on compile")


def test_a_fault_in_the_window_fails_only_the_window_build(sm100, gen):
    """The causal build and the plain one never run a window in their checks: a build wrong only at a window's
    edge fails the window build alone; the verdicts are kept per build."""
    install, _, checks = sm100
    install("window one key wider on the left")
    assert _select(_call(gen, "a window")) == "triton"
    assert _select(_call(gen, "causal")) == "cute" and _select(_call(gen, "plain")) == "cute"
    assert _select(_call(gen, "a window")) == "triton" and len(checks) == 3


@pytest.mark.parametrize("change, reason", [
    (dict(d=96), "head dims (D=96, Dv=96) must each be one of (64, 128)"),
    (dict(dtype=torch.float32), "fp16/bf16"),
    (dict(bias=torch.float16), "reads a bias in the operands' dtype"),
])
def test_calls_the_blackwell_forward_does_not_cover_keep_triton(sm100, gen, caplog, change, reason):
    install, _, checks = sm100
    kernel = install("none")
    args = list(_call(gen, "causal", d=change.get("d", 64), dtype=change.get("dtype", torch.bfloat16)))
    if "bias" in change:
        args[3] = torch.randn(3, 4, 90, 120, generator=gen).to(change["bias"])
    with caplog.at_level(logging.DEBUG, logger="gdpa_inductor"):
        assert _select(args) == "triton"
    assert any(reason in r.getMessage() for r in caplog.records)
    assert checks == [] and kernel.plans == []


def test_hopper_keeps_its_varlen_forward_with_no_blackwell_check(sm100, gen, monkeypatch):
    """On sm_90 the Hopper varlen forward's support check decides, with no Blackwell check asked: for the calls it
    takes and for those it leaves to Triton (a causal mask over two offsets tensors runs as its band; an fp32 bias)."""
    install, _, checks = sm100
    blackwell = install("none")
    for module in (fwd_support, varlen_support):
        monkeypatch.setattr(module, "on_sm100", lambda device: False)
    monkeypatch.setattr(varlen_support, "on_sm90", lambda device: True)

    def never(*args):
        raise AssertionError("the Blackwell varlen forward's support check was asked on Hopper")

    monkeypatch.setattr(sm100_varlen_forward, "sm100_varlen_forward_support", never)
    for feature in ("plain", "causal", "a bias in the operands' dtype"):
        assert _select(_call(gen, feature)) == "cute"
    assert _select(_call(gen, "an fp32 bias")) == "triton"
    assert blackwell.plans == [] and checks == []


@pytest.mark.parametrize("change, takes", [
    (dict(), True),
    (dict(causal=True, window=(16, 0), bias=torch.bfloat16), True),
    (dict(bias=torch.float32), True),
    (dict(bias=torch.float16), False),
    (dict(d=96), False),
    (dict(failed=True, causal=True), False),
])
def test_the_compiled_graph_sends_a_covered_varlen_forward_to_the_opaque_op(sm100, change, takes):
    """``direct_launch.cute_machine`` on fake-like (meta) tensors: sm_100 varlen forwards the Blackwell forward may
    take go through the opaque op, not one whose build failed its check (the backward's are
    ``test_sm100_varlen_backward``'s)."""
    d = change.get("d", 64)
    causal, window = change.get("causal", False), change.get("window", (-1, -1))
    q, v = (torch.empty(300, 4, d, device="meta", dtype=torch.bfloat16) for _ in range(2))
    bias = torch.empty(4, 300, 300, device="meta", dtype=change["bias"]) if "bias" in change else None
    if change.get("failed"):
        plan = plan_varlen_fwd_sm100(torch.bfloat16, d, "silu", causal, window, bias)
        self_check._verdicts[("forward", plan)] = (False, "stand-in failure")
    assert direct_launch.cute_machine(q, v, bias, None, varlen=(causal, window, "silu")) == takes
