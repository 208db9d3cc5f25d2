"""The dense forward on sm_100 (``lowering/sm100_forward.py``), with or without the causal mask and a bias: the CuTe
Blackwell forward serves a call only once the build it would run has passed its first-use self-check against Triton;
a build that mismatches, raises or fails to compile is disabled with one warning and its calls run on Triton, or
raise under a forced "cute". Here CPU tensors stand in for an sm_100 GPU's, stand-ins for the Blackwell launcher are
right or wrong on purpose (wrong everywhere, or only where a mask or a bias acts), and the reference stands in for
Triton's forward."""

from __future__ import annotations

import logging
import re
import threading

import pytest
import torch

from gdpa_inductor.kernels.cute import fwd_support
from gdpa_inductor.kernels.cute.fwd_plan import plan_fwd_sm100
from gdpa_inductor.kernels.reference import gdpa_reference
from gdpa_inductor.lowering import direct_launch, ops, self_check, sm100_forward, sm100_kernels
from gdpa_inductor.lowering.dispatch import select_forward_impl
from gdpa_inductor.lowering.sm100_forward import forward_check

pytestmark = pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")


class Sm100StandIn:
    """Stands in for ``gdpa_fwd_cute_sm100``: the forward's math, spoiled by ``fault``; records the plans it ran."""

    def __init__(self, fault: str):
        self.fault, self.plans, self.grids = fault, [], []

    def __call__(self, q, k, v, activation, scale, post_scale, negative_slope, causal=False, bias=None, out=None,
                 plan=None, window=(-1, -1), ctas=None):
        self.plans.append(plan)
        self.grids.append(ctas)
        if self.fault == "raises on compile":
            raise RuntimeError("DSLRuntimeError: the kernel did not compile (stand-in)")
        multiplier = None
        if self.fault == "causal mask ignored":
            causal = False
        elif self.fault == "causal mask aligned top-left" and causal:
            causal, multiplier = False, torch.ones(q.shape[2], k.shape[2], dtype=torch.float64).tril()
        if self.fault == "bias ignored" or bias is None:
            bias = None
        else:
            bias = bias.double()
        exact = gdpa_reference(q.double(), k.double(), v.double(), bias, activation, scale, post_scale, causal,
                               negative_slope, multiplier=multiplier)
        out = exact.to(q.dtype)
        if self.fault == "times 1.01":
            out = out * 1.01
        elif self.fault == "last row zeroed":
            out[..., -1, :] = 0
        elif self.fault == "one NaN":
            out[0, 0, 0, 0] = float("nan")
        return out


class Triton:
    """Stands in for ``gdpa_fwd_triton``: the reference in the operands' dtype; counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v, bias, activation, scale, post_scale, causal, negative_slope, traced=False):
        self.calls += 1
        return gdpa_reference(q, k, v, bias, activation, scale, post_scale, causal, negative_slope)


@pytest.fixture
def sm100(monkeypatch, sm100_machine):
    """CPU tensors as an sm_100 GPU's with the CuTe stack and Triton; returns ``install(fault)``, which puts a
    Blackwell stand-in in place, and the Triton stand-in."""
    triton = Triton()
    monkeypatch.setattr("gdpa_inductor.kernels.triton.gdpa_fwd.gdpa_fwd_triton", triton)

    def install(fault: str) -> Sm100StandIn:
        kernel = Sm100StandIn(fault)
        monkeypatch.setattr("gdpa_inductor.kernels.cute.gdpa_fwd.gdpa_fwd_cute_sm100", kernel)
        return kernel

    return install, triton, sm100_machine


def _qkv(gen, d=64, dv=None, nq=100, nk=150, dtype=torch.bfloat16):
    q = torch.randn(2, 4, nq, d, generator=gen).to(dtype)
    k = torch.randn(2, 4, nk, d, generator=gen).to(dtype)
    v = torch.randn(2, 4, nk, dv or d, generator=gen).to(dtype)
    return q, k, v


# the builds' features: (causal, how the call's bias is made), and the plan's ``bias`` it gives
FEATURES = {
    "plain": (False, None),
    "causal": (True, None),
    "a bias in the operands' dtype": (False, "full"),
    "a bias over rows and columns": (False, "rows and columns"),
    "an fp32 bias": (False, "fp32"),
    "one element": (False, "one element"),
    "causal, a key-padding bias": (True, "key row"),
}


def _bias(gen, kind, q, k):
    """The op's bias of ``kind`` for q and k [Z, H, N, D]: random, none zero."""
    z, h, nq, _ = q.shape
    nk = k.shape[2]
    shape, dtype = {None: (None, None), "full": ((z, h, nq, nk), q.dtype), "rows and columns": ((nq, nk), q.dtype),
                    "fp32": ((z, 1, nq, nk), torch.float32), "one element": ((), q.dtype),
                    "key row": ((z, 1, 1, nk), q.dtype)}[kind]
    if shape is None:
        return None
    return ((torch.rand(shape, generator=gen) + 0.25) * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)).to(dtype)


def _call(gen, feature, nq=100, nk=150, **change):
    """(q, k, v, bias, causal) of a call with the build's ``feature``."""
    causal, kind = FEATURES[feature]
    q, k, v = _qkv(gen, nq=nq, nk=nk, **change)
    return q, k, v, _bias(gen, kind, q, k), causal


def _forward(q, k, v, activation="silu", bias=None, causal=False):
    return ops.forward_impl(q, k, v, bias, activation, q.shape[-1] ** -0.5, 1.0, causal, 0.01)


def _expected(q, k, v, bias=None, causal=False):
    return gdpa_reference(q, k, v, bias, "silu", q.shape[-1] ** -0.5, 1.0, causal, 0.01)


def _cases(plan) -> list[tuple]:
    return list(forward_check(plan, torch.device("cpu")).cases())


@pytest.mark.parametrize("feature, nk, mask_keys", [*((f, 150, True) for f in FEATURES), ("plain", 256, False),
                                                    ("causal, a key-padding bias", 256, False)])
def test_a_correct_build_serves_after_one_check(sm100, gen, nk, mask_keys, feature):
    install, triton, checks = sm100
    kernel = install("none")
    q, k, v, bias, causal = _call(gen, feature, nk=nk)
    for _ in range(3):
        assert select_forward_impl(q, k, v, bias, causal, "silu") == "cute"
        out = _forward(q, k, v, bias=bias, causal=causal)
        assert len(checks) == 1
    plan = kernel.plans[-1]
    assert len(kernel.plans) == len(_cases(plan)) + 3 and triton.calls == len(_cases(plan))
    assert set(kernel.plans) == {plan}
    assert (plan.mask_keys, plan.causal, plan.window, plan.varlen) == (mask_keys, causal, False, False)
    assert plan.bias == {None: "", "fp32": "float32", "one element": "float32"}.get(FEATURES[feature][1], "bfloat16")
    torch.testing.assert_close(out, _expected(q, k, v, bias, causal), atol=2e-2, rtol=2e-2)
    assert "D=64, silu" in checks[0] and ("keys masked past Nk" in checks[0]) == mask_keys
    assert (", causal" in checks[0]) == causal and ("bias" in checks[0]) == (bias is not None)
    # the check runs few CTAs, each walking several tiles; the served calls take the device's grid
    checked = len(_cases(plan))
    assert kernel.grids == [sm100_kernels.CHECK_CTAS] * checked + [None] * 3


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", ["", "bfloat16", "float32"])
def test_the_check_exercises_exactly_the_builds_features(causal, bias):
    """The check's inputs: the causal mask at Nq == Nk and at Nq != Nk both ways; every kind of bias the build takes
    (its dtype, full, broadcast, one element), random and none zero; no mask or bias where the build has none; keys
    ending part-way through a key tile (Nk even under a 16-bit bias, read in pairs); GQA."""
    plan = plan_fwd_sm100(torch.bfloat16, 64, "silu", mask_keys=True, causal=causal, bias=bias)
    cases = _cases(plan)
    sizes = {(q.shape[2], k.shape[2]) for q, k, *_ in cases}
    assert all(c[7] == causal for c in cases) and all(nk % 128 for _, nk in sizes)
    assert any(q.shape[1] != k.shape[1] for q, k, *_ in cases)
    if causal:
        assert {nq == nk for nq, nk in sizes} == {True, False} and {nq < nk for nq, nk in sizes} == {True, False}
    biases = [c[3] for c in cases]
    if not bias:
        assert biases == [None] * len(cases)
        return
    assert all(b is not None and bool((b != 0).all()) and b.unique().numel() > 1 or b.numel() == 1 for b in biases)
    kinds = {(b.dtype, b.numel() == 1, b.numel() == 1 or b.shape[-2] == 1) for b in biases}
    if bias == "float32":
        assert kinds == {(torch.float32, False, False), (torch.float32, False, True), (torch.bfloat16, True, True)}
    else:
        assert {b.dtype for b in biases} == {torch.bfloat16} and len({b.dim() for b in biases}) > 1
        assert all(nk % 2 == 0 for _, nk in sizes) and any(b.shape[-2] == 1 for b in biases)


def test_each_build_is_checked_once(sm100, gen):
    """The verdict is kept per build (the compile key): another activation, head dim, dtype, key mask, causal mask or
    kind of bias is checked on its own first use, a repeated one is not."""
    install, _, checks = sm100
    install("none")
    for nk, d, dtype, act, feature in [
        (150, 64, torch.bfloat16, "silu", "plain"), (256, 64, torch.bfloat16, "silu", "plain"),
        (150, 128, torch.bfloat16, "silu", "plain"), (150, 64, torch.float16, "silu", "plain"),
        (150, 64, torch.bfloat16, "gelu_tanh", "plain"), (77, 64, torch.bfloat16, "silu", "plain"),
        (150, 64, torch.bfloat16, "silu", "causal"), (200, 64, torch.bfloat16, "silu", "causal"),
        (150, 64, torch.bfloat16, "silu", "a bias in the operands' dtype"),
        (150, 64, torch.bfloat16, "silu", "a bias over rows and columns"),
        (150, 64, torch.bfloat16, "silu", "an fp32 bias"), (150, 64, torch.bfloat16, "silu", "one element"),
        (150, 64, torch.bfloat16, "silu", "causal, a key-padding bias"),
    ]:
        q, k, v, bias, causal = _call(gen, feature, nk=nk, d=d, dtype=dtype)
        assert select_forward_impl(q, k, v, bias, causal, act) == "cute"
    assert len(checks) == 9 == len(set(checks))


# a build's feature, a fault of the Blackwell stand-in, and what the warning says
WRONG = [
    ("plain", "times 1.01", "relative error to Triton's is 0.00"),
    ("plain", "last row zeroed", "relative error to Triton's is"),
    ("plain", "one NaN", "NaN or Inf where Triton's has not"),
    ("plain", "raises on compile", "raised RuntimeError: DSLRuntimeError"),
    ("causal", "causal mask ignored", "relative error to Triton's is"),
    ("causal", "causal mask aligned top-left", "relative error to Triton's is"),
    ("causal", "one NaN", "NaN or Inf where Triton's has not"),
    ("a bias in the operands' dtype", "bias ignored", "relative error to Triton's is"),
    ("a bias over rows and columns", "times 1.01", "relative error to Triton's is"),
    ("an fp32 bias", "bias ignored", "relative error to Triton's is"),
    ("one element", "bias ignored", "relative error to Triton's is"),
    ("causal, a key-padding bias", "causal mask aligned top-left", "relative error to Triton's is"),
    ("causal, a key-padding bias", "raises on compile", "raised RuntimeError: DSLRuntimeError"),
]


@pytest.mark.parametrize("feature, fault, why", WRONG)
def test_a_wrong_build_is_disabled_and_its_calls_run_triton(sm100, gen, caplog, feature, fault, why):
    install, triton, checks = sm100
    kernel = install(fault)
    q, k, v, bias, causal = _call(gen, feature)
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        for _ in range(3):
            assert select_forward_impl(q, k, v, bias, causal, "silu") == "triton"
            out = _forward(q, k, v, bias=bias, causal=causal)
            assert torch.equal(out, _expected(q, k, v, bias, causal))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and len(checks) == 1
    assert "the CuTe Blackwell forward (bfloat16, D=64, silu" in warnings[0] and why in warnings[0]
    assert "disabled for this process" in warnings[0]
    # the check stops at the first mismatching case; nothing runs the build afterwards
    assert len(kernel.plans) <= len(_cases(kernel.plans[0]))
    assert triton.calls == 3 + len(kernel.plans) - (fault == "raises on compile")


@pytest.mark.parametrize("feature, fault", [("causal", "causal mask ignored"), ("causal", "causal mask aligned "
                                            "top-left"), ("a bias in the operands' dtype", "bias ignored")])
def test_a_fault_only_in_a_feature_fails_only_the_builds_with_it(sm100, gen, feature, fault):
    """A build wrong only where the causal mask or the bias acts fails its check; the build without that feature,
    whose check never exercises it, passes and keeps serving."""
    install, _, checks = sm100
    install(fault)
    q, k, v, bias, causal = _call(gen, feature)
    assert select_forward_impl(q, k, v, bias, causal, "silu") == "triton"
    assert select_forward_impl(q, k, v, None, False, "silu") == "cute"
    assert select_forward_impl(q, k, v, bias, causal, "silu") == "triton"
    assert len(checks) == 2


@pytest.mark.parametrize("fault, why", [("times 1.01", "relative error"), ("raises on compile", "raised")])
def test_forced_cute_raises_on_a_failed_check(sm100, gen, backend, fault, why):
    install, _, _ = sm100
    install(fault)
    backend("cute")
    q, k, v, bias, causal = _call(gen, "causal, a key-padding bias")
    for _ in range(2):
        with pytest.raises(ValueError, match=rf"backend='cute' cannot run this call: the CuTe Blackwell forward "
                                             rf"\(bfloat16, D=64, silu, .*causal, a bfloat16 bias.*\) .*{why}"):
            _forward(q, k, v, bias=bias, causal=causal)


def test_forced_cute_runs_a_build_that_passed(sm100, gen, backend):
    install, _, checks = sm100
    kernel = install("none")
    backend("cute")
    q, k, v = _qkv(gen)
    torch.testing.assert_close(_forward(q, k, v), _expected(q, k, v))
    assert len(checks) == 1 and len(kernel.plans) == len(_cases(kernel.plans[0])) + 1


@pytest.mark.parametrize("change, reason", [
    (dict(bias="fp16"), "reads a bias in the operands' dtype torch.bfloat16 (got torch.float16)"),
    (dict(bias="odd keys"), "reads a bias's values in pairs"),
    (dict(bias="per query"), "takes a bias of one element or one over the scores' rows and columns"),
    (dict(bias="too wide"), "does not broadcast to the scores'"),
    (dict(d=96), "head dims (D=96, Dv=96) must each be one of (64, 128)"),
    (dict(dv=128), "needs D = Dv"),
    (dict(dtype=torch.float32), "fp16/bf16"),
])
def test_calls_the_blackwell_forward_does_not_cover_keep_triton(sm100, gen, backend, change, reason):
    """No check runs for them; under "auto" Triton, under "cute" a ValueError with the support check's reason."""
    install, _, checks = sm100
    install("none")
    nk = 151 if change.get("bias") == "odd keys" else 150
    q, k, v = _qkv(gen, d=change.get("d", 64), dv=change.get("dv"), dtype=change.get("dtype", torch.bfloat16), nk=nk)
    shape, dtype = {"fp16": ((100, nk), torch.float16), "odd keys": ((100, nk), q.dtype),
                    "per query": ((100, 1), q.dtype), "too wide": ((3, 100, nk), q.dtype)}.get(
        change.get("bias"), (None, None))
    bias = None if shape is None else torch.randn(shape, generator=gen).to(dtype)
    assert select_forward_impl(q, k, v, bias, True, "silu") == "triton"
    backend("cute")
    with pytest.raises(ValueError, match=rf"cannot run this call: .*{re.escape(reason)}"):
        select_forward_impl(q, k, v, bias, True, "silu")
    assert checks == []


def test_the_check_runs_once_across_threads(sm100, gen):
    install, _, checks = sm100
    install("none")
    q, k, v, bias, causal = _call(gen, "causal, a key-padding bias")
    picks = []
    threads = [threading.Thread(target=lambda: picks.append(select_forward_impl(q, k, v, bias, causal, "silu")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert picks == ["cute"] * 4 and len(checks) == 1


def test_a_failure_after_the_check_falls_back_to_triton(sm100, gen):
    """A build that passed and later fails to launch hands its calls to Triton, as any CuTe failure does."""
    install, triton, _ = sm100
    install("none")
    q, k, v, bias, causal = _call(gen, "causal, a key-padding bias")
    assert select_forward_impl(q, k, v, bias, causal, "silu") == "cute"
    checked = triton.calls
    install("raises on compile")
    out = _forward(q, k, v, bias=bias, causal=causal)
    assert torch.equal(out, _expected(q, k, v, bias, causal))
    assert triton.calls == checked + 1


def test_the_op_runs_a_broadcast_batch_and_bias_on_the_blackwell_forward(sm100, gen):
    """[..., H, N, D] operands with more batch dims, k and v broadcast over the first, a bias over heads and rows
    and columns broadcast over the batch: the kernel runs on the flattened batch with the bias's 4-D view."""
    install, _, _ = sm100
    kernel = install("none")
    q = torch.randn(2, 3, 4, 100, 64, generator=gen).bfloat16()
    k, v = (torch.randn(3, 4, 150, 64, generator=gen).bfloat16() for _ in range(2))
    bias = torch.randn(4, 100, 150, generator=gen).bfloat16()
    out = torch.ops.gdpa.attention_fwd_v1(q, k, v, bias, "silu", 0.125, 1.0, True, 0.01)
    assert out.shape == (2, 3, 4, 100, 64)
    torch.testing.assert_close(out, _expected(q, k, v, bias, True), atol=2e-2, rtol=2e-2)
    assert kernel.plans[-1].causal and kernel.plans[-1].bias == "bfloat16"


def test_hopper_takes_its_cute_forward_with_no_blackwell_check(sm100, gen, monkeypatch):
    """On sm_90 the Hopper forward's own support check decides, with no Blackwell check asked: for the calls it
    takes (here D=96, the causal mask at Nk - Nq = 128, a bias) and those it leaves to Triton (a causal Nq > Nk, an
    fp32 bias), which the Blackwell forward would cover."""
    install, _, checks = sm100
    blackwell = install("none")
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(fwd_support, "on_sm100", lambda device: False)

    def never(*args):
        raise AssertionError("the Blackwell forward's support check was asked on Hopper")

    monkeypatch.setattr(sm100_forward, "sm100_forward_support", never)
    hopper = []
    monkeypatch.setattr("gdpa_inductor.kernels.cute.gdpa_fwd.gdpa_fwd_cute_op",
                        lambda q, k, v, *args: hopper.append(args) or torch.zeros_like(q))
    q, k, v = _qkv(gen, d=96, nq=100, nk=228)
    bias = torch.randn(100, 228, generator=gen).bfloat16()
    for call_bias, causal in ((None, False), (None, True), (bias, True)):
        assert select_forward_impl(q, k, v, call_bias, causal, "silu") == "cute"
        _forward(q, k, v, bias=call_bias, causal=causal)
    assert len(hopper) == 3
    q, k, v = _qkv(gen, nq=200, nk=150)
    for call_bias, causal in ((None, True), (torch.randn(200, 150, generator=gen), False)):
        assert select_forward_impl(q, k, v, call_bias, causal, "silu") == "triton"
    assert blackwell.plans == [] and checks == []


@pytest.mark.parametrize("change, takes", [
    (dict(), True),
    (dict(d=128), True),
    (dict(causal=True), True),
    (dict(bias=torch.bfloat16), True),
    (dict(bias=torch.float32), True),
    (dict(causal=True, bias=torch.bfloat16), True),
    (dict(bias=torch.float16), False),
    (dict(d=96), False),
    (dict(dtype=torch.float32), False),
    (dict(failed=True), False),
    (dict(failed=True, causal=True, bias=torch.float32), False),
])
def test_the_compiled_graph_sends_a_covered_forward_to_the_opaque_op(sm100, change, takes):
    """``direct_launch.cute_machine`` on fake-like (meta) tensors: sm_100 dense forwards the Blackwell forward may
    take, the causal mask and a bias included, go through the opaque op (which checks the build at run time); a call
    the graph gives no (causal, activation) of a dense call never, nor a forward whose build failed its check (the
    backward's: tests/lowering/test_sm100_backward.py)."""
    d = change.get("d", 64)
    dtype = change.get("dtype", torch.bfloat16)
    causal = change.get("causal", False)
    q, v = (torch.empty(2, 4, 256, d, device="meta", dtype=dtype) for _ in range(2))
    bias = torch.empty(256, 256, device="meta", dtype=change["bias"]) if "bias" in change else None
    if change.get("failed"):
        plan = plan_fwd_sm100(dtype, d, "silu", mask_keys=False, causal=causal,
                              bias="" if bias is None else str(bias.dtype).removeprefix("torch."))
        self_check._verdicts[("forward", plan)] = (False, "stand-in failure")
    assert direct_launch.cute_machine(q, v, bias, (causal, "silu")) == takes
    assert not direct_launch.cute_machine(q, v, bias, None)
