"""The dense backward on sm_100 (``lowering/sm100_backward.py``), taken as the forward is: the CuTe Blackwell
backward serves a call only once the build it would run has passed its first-use self-check against Triton's
backward (dq, dk and dv each); a build that mismatches, raises or fails to compile is disabled with one warning and
its calls run on Triton, or raise under a forced "cute". Here CPU tensors stand in for an sm_100 GPU's, stand-ins for
the Blackwell launcher are right or wrong on purpose, and the float64 reference rounded to the operands' dtype stands
in for Triton's backward."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from gdpa_inductor.kernels.cute import bwd_support, fwd_support
from gdpa_inductor.kernels.cute.bwd_plan import plan_bwd_sm100
from gdpa_inductor.kernels.cute.fwd_plan import plan_fwd_sm100
from gdpa_inductor.kernels.reference import gdpa_reference_backward
from gdpa_inductor.lowering import direct_launch, ops, self_check, sm100_kernels
from gdpa_inductor.lowering.dispatch import select_backward_impl
from gdpa_inductor.lowering.sm100_backward import backward_check

pytestmark = pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")

CHECKS = len(sm100_kernels.CHECK_SHAPES)


def _rounded_grads(dout, q, k, v, activation, scale, post_scale, negative_slope, causal=False, bias=None,
                   bias_grad=False):
    """(dq, dk, dv, dbias or None): the float64 reference backward, rounded to the operands' (and bias's) dtype."""
    grads = gdpa_reference_backward(dout.double(), q.double(), k.double(), v.double(),
                                    None if bias is None else bias.double(), activation, scale, post_scale, causal,
                                    negative_slope, bias_grad)
    return (*(g.to(q.dtype) for g in grads[:3]), grads[3].to(bias.dtype) if bias_grad else None)


class Sm100BwdStandIn:
    """Stands in for ``gdpa_bwd_cute_sm100``: the backward's math, spoiled by ``fault``; records the plans, the
    operand shapes and the grids it ran."""

    def __init__(self, fault: str):
        self.fault, self.plans, self.shapes, self.grids = fault, [], [], []

    def __call__(self, q, k, v, grad_out, activation, scale, post_scale, negative_slope, plan=None, causal=False,
                 bias=None, bias_grad=False, one_row_bias=False, ctas=None):
        self.plans.append(plan)
        self.shapes.append((tuple(q.shape), tuple(k.shape)))
        self.grids.append(ctas)
        if self.fault == "raises on compile":
            raise RuntimeError("DSLRuntimeError: the kernel did not compile (stand-in)")
        assert causal == plan.causal, "the launch's mask is its build's"
        assert (bias is not None, bias_grad) == (bool(plan.bias), plan.bias_grad), "the launch's bias is its build's"
        masked = causal and self.fault != "ignores the causal mask"
        added = None if self.fault == "ignores the bias" else bias
        dq, dk, dv, dbias = _rounded_grads(grad_out, q, k, v, activation, scale, post_scale, negative_slope, masked,
                                           added, bias_grad and added is not None)
        if bias_grad and added is None:
            dbias = torch.zeros_like(bias)
        if self.fault == "dv times 1.02":
            dv = dv * 1.02
        elif self.fault == "one NaN in dk":
            dk[0, 0, 0, 0] = float("nan")
        elif self.fault == "dq's last row zeroed":
            dq[..., -1, :] = 0
        elif self.fault == "dbias times 1.02":
            dbias = dbias * 1.02
        return dq, dk, dv, dbias


class Triton:
    """Stands in for ``gdpa_bwd_triton``: the float64 reference rounded to the operands' dtype; counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, dout, q, k, v, bias, activation, scale, post_scale, causal, negative_slope,
                 bias_requires_grad, traced=False):
        self.calls += 1
        return _rounded_grads(dout, q, k, v, activation, scale, post_scale, negative_slope, causal, bias,
                              bias_requires_grad)


@pytest.fixture
def sm100(monkeypatch, sm100_machine):
    """CPU tensors as an sm_100 GPU's with the CuTe stack and Triton; returns ``install(fault)``, which puts a
    Blackwell backward stand-in in place, the Triton stand-in, and the variants checked."""
    triton = Triton()
    monkeypatch.setattr("gdpa_inductor.kernels.triton.gdpa_bwd.gdpa_bwd_triton", triton)

    def install(fault: str) -> Sm100BwdStandIn:
        kernel = Sm100BwdStandIn(fault)
        monkeypatch.setattr("gdpa_inductor.kernels.cute.gdpa_bwd.gdpa_bwd_cute_sm100", kernel)
        return kernel

    return install, triton, sm100_machine


def _operands(gen, d=64, dv=None, nq=100, nk=150, hkv=4, dtype=torch.bfloat16):
    q = torch.randn(2, 4, nq, d, generator=gen).to(dtype)
    k = torch.randn(2, hkv, nk, d, generator=gen).to(dtype)
    v = torch.randn(2, hkv, nk, dv or d, generator=gen).to(dtype)
    dout = torch.randn(2, 4, nq, dv or d, generator=gen).to(dtype)
    return dout, q, k, v


def _backward(dout, q, k, v, causal=False, bias=None, bias_grad=False):
    return ops.backward_impl(dout, q, k, v, bias, "silu", q.shape[-1] ** -0.5, 1.0, causal, 0.01, bias_grad)


def _select(dout, q, k, v, activation="silu", causal=False, bias=None, bias_grad=False):
    return select_backward_impl(q, k, v, bias, causal, activation, bias_grad, dout)


def _assert_expected(grads, dout, q, k, v, causal=False, bias=None, bias_grad=False):
    """``grads`` (dq, dk, dv, then dbias or anything) are the backward's at ``_backward``'s parameters, as Triton
    rounds them."""
    want = _rounded_grads(dout, q, k, v, "silu", q.shape[-1] ** -0.5, 1.0, 0.01, causal, bias, bias_grad)
    assert all(torch.equal(got, w) for got, w in zip(grads[:3], want))
    if bias_grad:
        assert torch.equal(grads[3], want[3])


@pytest.mark.parametrize("nq, mask_queries", [(100, True), (256, False)])
def test_a_correct_build_serves_after_one_check(sm100, gen, nq, mask_queries):
    install, triton, checks = sm100
    kernel = install("none")
    dout, q, k, v = _operands(gen, nq=nq, hkv=2)
    for calls in range(1, 4):
        assert _select(dout, q, k, v) == "cute"
        dq, dk, dv, dbias = _backward(dout, q, k, v)
        assert len(checks) == 1
        assert len(kernel.plans) == CHECKS + calls
    assert triton.calls == CHECKS
    assert {p.mask_queries for p in kernel.plans} == {mask_queries} and kernel.plans[0] == kernel.plans[-1]
    _assert_expected((dq, dk, dv), dout, q, k, v)
    assert dbias is None and dk.shape == k.shape
    assert "the CuTe Blackwell backward (bfloat16, D=64, silu, 2 Q/dO stages" in checks[0]
    assert ("queries masked past Nq" in checks[0]) == mask_queries
    # the check runs few CTAs, each walking several tiles; the served calls take the device's grid
    assert kernel.grids == [sm100_kernels.CHECK_CTAS] * CHECKS + [None] * 3


@pytest.mark.parametrize("mask_queries", [True, False])
def test_the_check_runs_partial_query_and_key_tiles_and_gqa(sm100, mask_queries):
    """The check's inputs: keys ending part-way through a 128-key tile, queries too where the build masks them
    (else whole 128-row tiles), one case with grouped heads, dout of q's shape."""
    install, _, _ = sm100
    kernel = install("none")
    plan = plan_bwd_sm100(torch.bfloat16, 64, "silu", mask_queries=mask_queries)
    assert self_check.verdict(("backward", plan), lambda: backward_check(plan, torch.device("cpu"))) == (True, "")
    (q1, k1), (q2, k2) = kernel.shapes
    assert all(k[2] % 128 for k in (k1, k2))
    assert all(bool(q[2] % 128) == mask_queries for q in (q1, q2))
    assert q1[1] == k1[1] and q2[1] == 2 * k2[1]
    assert kernel.plans == [plan, plan]


@pytest.mark.parametrize("nq", [100, 200])
def test_a_causal_call_runs_the_causal_build_after_its_own_check(sm100, gen, nq):
    """A causal call is checked and run on the causal build (its own verdict beside the unmasked build's), under the
    mask at Nq below and above Nk, and gets the masked gradients."""
    install, triton, checks = sm100
    kernel = install("none")
    dout, q, k, v = _operands(gen, nq=nq)
    assert _select(dout, q, k, v, causal=True) == "cute"
    grads = _backward(dout, q, k, v, causal=True)
    _assert_expected(grads, dout, q, k, v, causal=True)
    assert len(checks) == 1 and "causal" in checks[0]
    assert all(p.causal for p in kernel.plans) and len(kernel.plans) == CHECKS + 1
    (q1, k1), (q2, k2) = kernel.shapes[:2]
    assert q1[2] > k1[2] and q2[2] < k2[2]
    assert _select(dout, q, k, v) == "cute" and len(checks) == 2 and "causal" not in checks[1]


def test_a_build_that_ignores_the_causal_mask_is_caught(sm100, gen, caplog):
    install, _, checks = sm100
    install("ignores the causal mask")
    dout, q, k, v = _operands(gen)
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        assert _select(dout, q, k, v, causal=True) == "triton"
        _assert_expected(_backward(dout, q, k, v, causal=True), dout, q, k, v, causal=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "causal" in warnings[0] and "relative error" in warnings[0]
    # the unmasked build is checked on its own and serves
    assert _select(dout, q, k, v) == "cute" and len(checks) == 2


BIASES = {
    "per head, its gradient": (lambda gen, nq, nk: torch.randn(4, nq, nk, generator=gen).bfloat16(), True),
    "fp32 per sample and head": (lambda gen, nq, nk: torch.randn(2, 4, nq, nk, generator=gen), False),
    "fp32 shared, its gradient": (lambda gen, nq, nk: torch.randn(nq, nk, generator=gen), True),
    "one element": (lambda gen, nq, nk: torch.randn((), generator=gen), False),
    "one row, its gradient": (lambda gen, nq, nk: torch.randn(1, nk, generator=gen).bfloat16(), True),
}


@pytest.mark.parametrize("case", BIASES)
@pytest.mark.parametrize("causal", [False, True])
def test_a_biased_call_runs_its_bias_build_after_its_own_check(sm100, gen, case, causal):
    """A call with a bias (and its gradient) is checked and run on the build of its bias's element type, causal or
    not, and gets the reference's gradients, dbias in the bias's shape and dtype."""
    make, bias_grad = BIASES[case]
    install, _, checks = sm100
    kernel = install("none")
    dout, q, k, v = _operands(gen)
    bias = make(gen, q.shape[-2], k.shape[-2])
    assert _select(dout, q, k, v, causal=causal, bias=bias, bias_grad=bias_grad) == "cute"
    grads = _backward(dout, q, k, v, causal, bias, bias_grad)
    _assert_expected(grads, dout, q, k, v, causal, bias, bias_grad)
    assert (grads[3] is None) != bias_grad and (not bias_grad or grads[3].shape == bias.shape)
    plan = kernel.plans[-1]
    assert plan.bias == ("float32" if bias.dtype == torch.float32 else "bfloat16") and plan.bias_grad == bias_grad
    assert plan.causal == causal and len(checks) == 1 and "bias" in checks[0]


@pytest.mark.parametrize("fault", ["ignores the bias", "dbias times 1.02"])
def test_a_build_wrong_in_its_bias_is_caught(sm100, gen, caplog, fault):
    install, _, checks = sm100
    install(fault)
    dout, q, k, v = _operands(gen)
    bias = torch.randn(4, q.shape[-2], k.shape[-2], generator=gen).bfloat16()
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        assert _select(dout, q, k, v, bias=bias, bias_grad=True) == "triton"
        _assert_expected(_backward(dout, q, k, v, False, bias, True), dout, q, k, v, False, bias, True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "bias" in warnings[0] and "relative error" in warnings[0]


def test_each_build_is_checked_once(sm100, gen):
    """The verdict is kept per build (the compile key): another activation, head dim, dtype or query mask is checked
    on its own first use, a repeated one is not."""
    install, _, checks = sm100
    install("none")
    for nq, d, dtype, act in [(100, 64, torch.bfloat16, "silu"), (256, 64, torch.bfloat16, "silu"),
                              (100, 128, torch.bfloat16, "silu"), (100, 64, torch.float16, "silu"),
                              (100, 64, torch.bfloat16, "gelu_tanh"), (77, 64, torch.bfloat16, "silu")]:
        dout, q, k, v = _operands(gen, d=d, nq=nq, dtype=dtype)
        assert _select(dout, q, k, v, act) == "cute"
    assert len(checks) == 5 == len(set(checks))


@pytest.mark.parametrize("fault, why", [("dv times 1.02", "dv's relative error to Triton's is 0.0"),
                                        ("dq's last row zeroed", "dq's relative error to Triton's is"),
                                        ("one NaN in dk", "dk has NaN or Inf where Triton's has not"),
                                        ("raises on compile", "raised RuntimeError: DSLRuntimeError")])
def test_a_wrong_build_is_disabled_and_its_calls_run_triton(sm100, gen, caplog, fault, why):
    install, triton, checks = sm100
    kernel = install(fault)
    dout, q, k, v = _operands(gen)
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        for _ in range(3):
            assert _select(dout, q, k, v) == "triton"
            _assert_expected(_backward(dout, q, k, v), dout, q, k, v)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and len(checks) == 1
    assert "the CuTe Blackwell backward (bfloat16, D=64, silu" in warnings[0] and why in warnings[0]
    assert "disabled for this process" in warnings[0]
    # the check stops at the first mismatching case; nothing runs the build afterwards
    assert len(kernel.plans) == 1
    # Triton: once in the check (none where the build raised before it), then once a call
    assert triton.calls == 3 + (fault != "raises on compile")


def test_the_op_and_its_autograd_run_a_build_that_passed(sm100, gen):
    """The custom op's backward and the eager autograd both reach the Blackwell backward through the dispatch."""
    install, _, checks = sm100
    kernel = install("none")
    dout, q, k, v = _operands(gen)
    dq, dk, dv, dbias = torch.ops.gdpa.attention_bwd_v1(dout, q, k, v, None, "silu", 0.125, 1.0, False, 0.01, False)
    assert dbias.numel() == 0
    _assert_expected((dq, dk, dv), dout, q, k, v)
    grads = ops.EAGER_AUTOGRAD.backward_fn(dout, q, k, v, None, "silu", 0.125, 1.0, False, 0.01, False)
    assert all(torch.equal(a, b) for a, b in zip(grads[:3], (dq, dk, dv)))
    assert len(checks) == 1 and len(kernel.plans) == CHECKS + 2


@pytest.mark.parametrize("fault, why", [("dv times 1.02", "relative error"), ("one NaN in dk", "NaN"),
                                        ("raises on compile", "raised")])
def test_forced_cute_raises_on_a_failed_check(sm100, gen, backend, fault, why):
    install, _, _ = sm100
    install(fault)
    backend("cute")
    dout, q, k, v = _operands(gen)
    for _ in range(2):
        with pytest.raises(ValueError, match=rf"backend='cute' cannot run this call: the CuTe Blackwell backward "
                                             rf"\(bfloat16, D=64, silu, .*\) .*{why}"):
            _backward(dout, q, k, v)


def test_forced_cute_runs_a_build_that_passed(sm100, gen, backend):
    install, _, checks = sm100
    kernel = install("none")
    backend("cute")
    dout, q, k, v = _operands(gen, nq=130, hkv=1)
    grads = _backward(dout, q, k, v)
    _assert_expected(grads, dout, q, k, v)
    assert len(checks) == 1 and len(kernel.plans) == CHECKS + 1


# calls the Blackwell backward does not cover: what differs from a covered call, and the support check's reason
UNCOVERED = {
    "bias of keys not contiguous": (dict(bias="columns"), "keys contiguous"),
    "bias of another dtype": (dict(bias="float16"), "operands' dtype or float32"),
    "one element's gradient": (dict(bias="one", bias_grad=True), "a tensor only"),
    "D=96": (dict(d=96), "head dims (D=96, Dv=96) must each be one of (64, 128)"),
    "Dv=128": (dict(dv=128), "needs D = Dv"),
    "fp32": (dict(dtype=torch.float32), "fp16/bf16"),
}


@pytest.mark.parametrize("case", UNCOVERED)
def test_calls_the_blackwell_backward_does_not_cover_keep_triton(sm100, gen, backend, case):
    """No check runs for them; under "auto" Triton, under "cute" a ValueError with the support check's reason."""
    change, reason = UNCOVERED[case]
    install, _, checks = sm100
    kernel = install("none")
    dout, q, k, v = _operands(gen, d=change.get("d", 64), dv=change.get("dv"),
                              dtype=change.get("dtype", torch.bfloat16))
    bias = {None: None, "columns": torch.randn(k.shape[-2], q.shape[-2], generator=gen).to(q.dtype).T,
            "float16": torch.randn(q.shape[-2], k.shape[-2], generator=gen).half(),
            "one": torch.randn((), generator=gen)}[change.get("bias")]
    call = (q, k, v, bias, change.get("causal", False), "silu", change.get("bias_grad", False), dout)
    assert select_backward_impl(*call) == "triton"
    backend("cute")
    with pytest.raises(ValueError, match=rf"cannot run this call: .*{re.escape(reason)}"):
        select_backward_impl(*call)
    assert checks == [] and kernel.plans == []


def test_a_gradient_of_another_dtype_keeps_triton(sm100, gen):
    install, _, checks = sm100
    install("none")
    dout, q, k, v = _operands(gen)
    assert _select(dout.float(), q, k, v) == "triton"
    assert checks == []
    # without dout, the dispatch takes the output's shape and q's dtype
    assert select_backward_impl(q, k, v, None, False, "silu") == "cute"


def test_a_failure_after_the_check_falls_back_to_triton(sm100, gen):
    """A build that passed and later fails to launch hands its calls to Triton, as any CuTe failure does."""
    install, triton, _ = sm100
    install("none")
    dout, q, k, v = _operands(gen)
    assert _select(dout, q, k, v) == "cute"
    install("raises on compile")
    grads = _backward(dout, q, k, v)
    _assert_expected(grads, dout, q, k, v)
    assert triton.calls == CHECKS + 1


def test_hopper_takes_its_cute_backward_with_no_blackwell_check(sm100, gen, monkeypatch):
    install, _, checks = sm100
    blackwell = install("none")
    for module in (fwd_support, bwd_support):
        monkeypatch.setattr(module, "on_sm100", lambda device: False)
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    hopper = []
    monkeypatch.setattr("gdpa_inductor.kernels.cute.gdpa_bwd.gdpa_bwd_cute_op",
                        lambda dout, q, k, v, *args: hopper.append(args) or (q, k, v, None))
    dout, q, k, v = _operands(gen, d=96)
    assert _select(dout, q, k, v) == "cute"
    _backward(dout, q, k, v)
    assert len(hopper) == 1 and blackwell.plans == [] and checks == []


@pytest.mark.parametrize("change, backward, forward", [
    (dict(), True, True),
    (dict(d=128), True, True),
    (dict(causal=True), True, True),
    (dict(bias=True), True, True),
    (dict(bias=torch.float16), False, False),
    (dict(d=96), False, False),
    (dict(dtype=torch.float32), False, False),
    (dict(failed="backward"), False, True),
    (dict(causal=True, failed="backward"), True, True),
    (dict(bias=True, failed="bias gradient"), False, True),
    (dict(failed="forward"), True, False),
])
def test_the_compiled_graph_sends_a_covered_backward_to_the_opaque_op(sm100, change, backward, forward):
    """``direct_launch.cute_machine`` on fake-like (meta) tensors: sm_100 dense backwards the Blackwell backward may
    take go through the opaque op (which checks the build at run time), with the causal mask and a bias of a dtype it
    has builds for, not one whose build failed its check (a bias's with or without its gradient: the graph does not
    know which the call wants); each build's verdict is its own, and the forward's."""
    d = change.get("d", 64)
    dtype = change.get("dtype", torch.bfloat16)
    q, v = (torch.empty(2, 4, 256, d, device="meta", dtype=dtype) for _ in range(2))
    bias = None
    if change.get("bias"):
        bias = torch.empty(256, 256, device="meta", dtype=dtype if change["bias"] is True else change["bias"])
    if change.get("failed") == "backward":
        self_check._verdicts[("backward", plan_bwd_sm100(dtype, d, "silu", mask_queries=True))] = (False, "stand-in")
    if change.get("failed") == "bias gradient":
        failed = plan_bwd_sm100(dtype, d, "silu", mask_queries=False, bias="bfloat16", bias_grad=True)
        self_check._verdicts[("backward", failed)] = (False, "stand-in")
    if change.get("failed") == "forward":
        self_check._verdicts[("forward", plan_fwd_sm100(dtype, d, "silu", mask_keys=False))] = (False, "stand-in")
    dense = (change.get("causal", False), "silu")
    assert direct_launch.cute_machine(q, v, bias, dense, backward=True) == backward
    assert direct_launch.cute_machine(q, v, bias, dense) == forward
    assert not direct_launch.cute_machine(q, v, bias, None, backward=True)


def test_an_operand_broadcast_over_batch_dims_gets_its_gradient_summed(sm100, gen):
    """[..., H, N, D] operands with more batch dims, k and v broadcast over the first: the kernel runs on the
    flattened batch and the op sums k's and v's gradients back to their shapes."""
    install, _, _ = sm100
    kernel = install("none")
    q, dout = (torch.randn(2, 3, 4, 100, 64, generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(3, 2, 150, 64, generator=gen).bfloat16() for _ in range(2))
    dq, dk, dv, _ = _backward(dout, q, k, v)
    assert kernel.shapes[-1] == ((6, 4, 100, 64), (6, 2, 150, 64))
    want = gdpa_reference_backward(dout.double(), q.double(), k.double(), v.double(), None, "silu", 0.125, 1.0,
                                   False, 0.01, False)
    for got, exact in zip((dq, dk, dv), want):
        assert got.shape == exact.shape and got.is_contiguous()
        assert self_check.rel_err(got, exact) < 1e-2
