"""The dense forward on sm_100 (``lowering/sm100_forward.py``): the CuTe Blackwell forward serves a call only once
the build it would run has passed its first-use self-check against Triton; a build that mismatches, raises or fails
to compile is disabled with one warning and its calls run on Triton, or raise under a forced "cute". Here CPU
tensors stand in for an sm_100 GPU's, stand-ins for the Blackwell launcher are right or wrong on purpose, and the
reference stands in for Triton's forward."""

from __future__ import annotations

import logging
import re
import threading

import pytest
import torch

from gdpa_inductor.kernels.cute import fwd_support
from gdpa_inductor.kernels.cute.fwd_plan import plan_fwd_sm100
from gdpa_inductor.kernels.reference import gdpa_reference
from gdpa_inductor.lowering import direct_launch, dispatch, fallback, ops, self_check, sm100_forward
from gdpa_inductor.lowering.dispatch import select_forward_impl

pytestmark = pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")

CHECKS = len(sm100_forward.CHECK_SHAPES)


class Sm100StandIn:
    """Stands in for ``gdpa_fwd_cute_sm100``: the forward's math, spoiled by ``fault``; records the plans it ran."""

    def __init__(self, fault: str):
        self.fault, self.plans = fault, []

    def __call__(self, q, k, v, activation, scale, post_scale, negative_slope, out=None, plan=None):
        self.plans.append(plan)
        if self.fault == "raises on compile":
            raise RuntimeError("DSLRuntimeError: the kernel did not compile (stand-in)")
        exact = gdpa_reference(q.double(), k.double(), v.double(), None, activation, scale, post_scale, False,
                               negative_slope)
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
def sm100(monkeypatch):
    """CPU tensors as an sm_100 GPU's with the CuTe stack and Triton; returns ``install(fault)``, which puts a
    Blackwell stand-in in place, and the Triton stand-in."""
    monkeypatch.setattr(self_check, "_verdicts", {})
    monkeypatch.setattr(fallback, "_failed", {})
    monkeypatch.setattr(fwd_support, "cute_dsl_available", lambda: True)
    monkeypatch.setattr(fwd_support, "on_sm100", lambda device: True)
    monkeypatch.setattr(fwd_support, "tma_layout", lambda t: True)
    monkeypatch.setattr(dispatch, "on_cuda", lambda q: True)
    monkeypatch.setattr(dispatch, "triton_support", lambda *a: (True, "supported"))
    triton = Triton()
    monkeypatch.setattr("gdpa_inductor.kernels.triton.gdpa_fwd.gdpa_fwd_triton", triton)
    checks = []
    run_check = self_check.run_check
    monkeypatch.setattr(self_check, "run_check", lambda check: checks.append(check.variant) or run_check(check))

    def install(fault: str) -> Sm100StandIn:
        kernel = Sm100StandIn(fault)
        monkeypatch.setattr("gdpa_inductor.kernels.cute.gdpa_fwd.gdpa_fwd_cute_sm100", kernel)
        return kernel

    return install, triton, checks


def _qkv(gen, d=64, dv=None, nq=100, nk=150, dtype=torch.bfloat16):
    q = torch.randn(2, 4, nq, d, generator=gen).to(dtype)
    k = torch.randn(2, 4, nk, d, generator=gen).to(dtype)
    v = torch.randn(2, 4, nk, dv or d, generator=gen).to(dtype)
    return q, k, v


def _forward(q, k, v, activation="silu", bias=None, causal=False):
    return ops.forward_impl(q, k, v, bias, activation, q.shape[-1] ** -0.5, 1.0, causal, 0.01)


@pytest.mark.parametrize("nk, mask_keys", [(150, True), (256, False)])
def test_a_correct_build_serves_after_one_check(sm100, gen, nk, mask_keys):
    install, triton, checks = sm100
    kernel = install("none")
    q, k, v = _qkv(gen, nk=nk)
    for calls in range(1, 4):
        assert select_forward_impl(q, k, v, None, False, "silu") == "cute"
        out = _forward(q, k, v)
        assert len(checks) == 1
        assert len(kernel.plans) == CHECKS + calls
    assert triton.calls == CHECKS
    assert {p.mask_keys for p in kernel.plans} == {mask_keys} and kernel.plans[0] == kernel.plans[-1]
    assert torch.equal(out, kernel(q, k, v, "silu", 64**-0.5, 1.0, 0.01))
    assert "D=64, silu" in checks[0] and ("keys masked past Nk" in checks[0]) == mask_keys


def test_each_build_is_checked_once(sm100, gen):
    """The verdict is kept per build (the compile key): another activation, head dim, dtype or key mask is checked
    on its own first use, a repeated one is not."""
    install, _, checks = sm100
    install("none")
    for nk, d, dtype, act in [(150, 64, torch.bfloat16, "silu"), (256, 64, torch.bfloat16, "silu"),
                              (150, 128, torch.bfloat16, "silu"), (150, 64, torch.float16, "silu"),
                              (150, 64, torch.bfloat16, "gelu_tanh"), (77, 64, torch.bfloat16, "silu")]:
        q, k, v = _qkv(gen, d=d, nk=nk, dtype=dtype)
        assert select_forward_impl(q, k, v, None, False, act) == "cute"
    assert len(checks) == 5 == len(set(checks))


@pytest.mark.parametrize("fault, why", [("times 1.01", "relative error to Triton's is 0.00"),
                                        ("last row zeroed", "relative error to Triton's is"),
                                        ("one NaN", "NaN or Inf where Triton's has not"),
                                        ("raises on compile", "raised RuntimeError: DSLRuntimeError")])
def test_a_wrong_build_is_disabled_and_its_calls_run_triton(sm100, gen, caplog, fault, why):
    install, triton, checks = sm100
    kernel = install(fault)
    q, k, v = _qkv(gen)
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        for _ in range(3):
            assert select_forward_impl(q, k, v, None, False, "silu") == "triton"
            out = _forward(q, k, v)
            assert torch.equal(out, gdpa_reference(q, k, v, None, "silu", 0.125, 1.0, False, 0.01))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and len(checks) == 1
    assert "the CuTe Blackwell forward (bfloat16, D=64, silu" in warnings[0] and why in warnings[0]
    assert "disabled for this process" in warnings[0]
    # the check stops at the first mismatching case; nothing runs the build afterwards
    assert len(kernel.plans) == 1
    # Triton: once in the check (none where the build raised before it), then once a call
    assert triton.calls == 3 + (fault != "raises on compile")


@pytest.mark.parametrize("fault, why", [("times 1.01", "relative error"), ("raises on compile", "raised")])
def test_forced_cute_raises_on_a_failed_check(sm100, gen, backend, fault, why):
    install, _, _ = sm100
    install(fault)
    backend("cute")
    q, k, v = _qkv(gen)
    for _ in range(2):
        with pytest.raises(ValueError, match=rf"backend='cute' cannot run this call: the CuTe Blackwell forward "
                                             rf"\(bfloat16, D=64, silu, .*\) .*{why}"):
            _forward(q, k, v)


def test_forced_cute_runs_a_build_that_passed(sm100, gen, backend):
    install, _, checks = sm100
    kernel = install("none")
    backend("cute")
    q, k, v = _qkv(gen)
    torch.testing.assert_close(_forward(q, k, v), gdpa_reference(q, k, v, None, "silu", 0.125, 1.0, False, 0.01))
    assert len(checks) == 1 and len(kernel.plans) == CHECKS + 1


@pytest.mark.parametrize("change, reason", [
    (dict(causal=True), "self-checked without a causal mask or bias"),
    (dict(bias=True), "self-checked without a causal mask or bias"),
    (dict(d=96), "head dims (D=96, Dv=96) must each be one of (64, 128)"),
    (dict(dv=128), "needs D = Dv"),
    (dict(dtype=torch.float32), "fp16/bf16"),
])
def test_calls_the_blackwell_forward_does_not_cover_keep_triton(sm100, gen, backend, change, reason):
    """No check runs for them; under "auto" Triton, under "cute" a ValueError with the support check's reason."""
    install, _, checks = sm100
    install("none")
    q, k, v = _qkv(gen, d=change.get("d", 64), dv=change.get("dv"), dtype=change.get("dtype", torch.bfloat16))
    bias = torch.randn(q.shape[-2], k.shape[-2], generator=gen).to(q.dtype) if change.get("bias") else None
    causal = change.get("causal", False)
    assert select_forward_impl(q, k, v, bias, causal, "silu") == "triton"
    backend("cute")
    with pytest.raises(ValueError, match=rf"cannot run this call: .*{re.escape(reason)}"):
        select_forward_impl(q, k, v, bias, causal, "silu")
    assert checks == []


def test_the_check_runs_once_across_threads(sm100, gen):
    install, _, checks = sm100
    install("none")
    q, k, v = _qkv(gen)
    picks = []
    threads = [threading.Thread(target=lambda: picks.append(select_forward_impl(q, k, v, None, False, "silu")))
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
    q, k, v = _qkv(gen)
    assert select_forward_impl(q, k, v, None, False, "silu") == "cute"
    install("raises on compile")
    out = _forward(q, k, v)
    assert torch.equal(out, gdpa_reference(q, k, v, None, "silu", 0.125, 1.0, False, 0.01))
    assert triton.calls == CHECKS + 1


def test_hopper_takes_its_cute_forward_with_no_self_check(sm100, gen, monkeypatch):
    install, _, checks = sm100
    blackwell = install("none")
    monkeypatch.setattr(fwd_support, "on_sm90", lambda device: True)
    monkeypatch.setattr(fwd_support, "on_sm100", lambda device: False)
    hopper = []
    monkeypatch.setattr("gdpa_inductor.kernels.cute.gdpa_fwd.gdpa_fwd_cute_op",
                        lambda q, k, v, *args: hopper.append(args) or torch.zeros_like(q))
    q, k, v = _qkv(gen, d=96)
    assert select_forward_impl(q, k, v, None, False, "silu") == "cute"
    _forward(q, k, v)
    assert len(hopper) == 1 and blackwell.plans == [] and checks == []


@pytest.mark.parametrize("change, takes", [
    (dict(), True),
    (dict(d=128), True),
    (dict(causal=True), False),
    (dict(bias=True), False),
    (dict(d=96), False),
    (dict(dtype=torch.float32), False),
    (dict(failed=True), False),
])
def test_the_compiled_graph_sends_a_covered_forward_to_the_opaque_op(sm100, change, takes):
    """``direct_launch.cute_machine`` on fake-like (meta) tensors: sm_100 dense forwards the Blackwell forward may
    take go through the opaque op (which checks the build at run time); a call the graph gives no (causal,
    activation) of a dense call never, nor a forward whose build failed its check (the backward's:
    tests/lowering/test_sm100_backward.py)."""
    d = change.get("d", 64)
    dtype = change.get("dtype", torch.bfloat16)
    q, v = (torch.empty(2, 4, 256, d, device="meta", dtype=dtype) for _ in range(2))
    bias = torch.empty(256, 256, device="meta", dtype=dtype) if change.get("bias") else None
    if change.get("failed"):
        plan = plan_fwd_sm100(dtype, d, "silu", mask_keys=False)
        self_check._verdicts[("forward", plan)] = (False, "stand-in failure")
    assert direct_launch.cute_machine(q, v, bias, (change.get("causal", False), "silu")) == takes
    assert not direct_launch.cute_machine(q, v, bias, None)
