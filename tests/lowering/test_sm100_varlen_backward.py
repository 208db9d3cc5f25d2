"""The varlen backward on sm_100 (``lowering/sm100_varlen_backward.py``), taken as the varlen forward is: the CuTe
Blackwell backward serves a call only once the build it would run (its causal mask or window) has passed its
first-use self-check against Triton's varlen backward (dq, dk and dv each); a build that mismatches, raises or fails
to compile is disabled with one warning and its calls run on Triton. Here CPU tensors stand in for an sm_100 GPU's,
a stand-in for the Blackwell varlen launcher is right or wrong on purpose (everywhere, only where the mask acts, or
only in the last sample), and autograd of the reference, sample by sample over the launchers' sides, stands in for
Triton's varlen backward."""

from __future__ import annotations

import logging

import pytest
import torch

from gdpa_inductor.kernels.cute import fwd_support
from gdpa_inductor.kernels.cute.varlen_bwd import plan_varlen_bwd_sm100
from gdpa_inductor.kernels.reference import gdpa_reference
from gdpa_inductor.kernels.reference_varlen import gdpa_varlen_reference_backward
from gdpa_inductor.kernels.triton.varlen_schedule import ORDER, row
from gdpa_inductor.lowering import self_check, sm100_kernels, varlen_ops
from gdpa_inductor.lowering.dispatch import select_varlen_backward_impl

pytestmark = pytest.mark.skipif(not fwd_support.cute_dsl_available(), reason="nvidia-cutlass-dsl is not installed")


def _rows(side, rank: int, z: int):
    start, n = int(side.starts[rank]), int(side.lengths[rank])
    if side.jagged:
        return (slice(start, start + n),)
    return z if side.tensor.shape[0] > 1 else 0, slice(start, start + n)


def _grads_on_sides(dout, qs, ks, v, order, activation, scale, post_scale, slope, causal, window, bias=None,
                    bias_grad=False, spoil=None):
    """(dq, dk, dv, dbias or None): autograd of the float64 reference, sample by sample over the sides (sample z's
    query i and key j adding ``bias[z, h, i, j]``), rounded to the operands' and the bias's dtypes; ``spoil(z)``:
    (causal, window, keep the bias, scale dk by) for sample z."""
    grads = [torch.zeros(t.shape, dtype=torch.float64) for t in (qs.tensor, ks.tensor, v)]
    leaf = None if bias is None else bias.double().clone().requires_grad_()
    dbias = None if leaf is None else torch.zeros_like(leaf)
    for rank in range(qs.batch):
        z = int(order[rank])
        nq, nk = int(qs.lengths[rank]), int(ks.lengths[rank])
        if not (nq and nk):
            continue
        qi, ki = _rows(qs, rank, z), _rows(ks, rank, z)
        leaves = [x[i].transpose(0, 1).double().requires_grad_() for x, i in ((qs.tensor, qi), (ks.tensor, ki),
                                                                               (v, ki))]
        c, w, keep_bias, factor = spoil(z) if spoil else (causal, window, True, 1.0)
        bz = None
        if leaf is not None and keep_bias:
            full = leaf.expand(qs.batch, qs.tensor.shape[-2], qs.max_len, ks.max_len) if leaf.numel() > 1 else leaf
            bz = full[z, :, :nq, :nk] if leaf.numel() > 1 else full
        out = gdpa_reference(*leaves, bz, activation, scale, post_scale, c, slope, window=w)
        wrt = leaves + ([leaf] if bz is not None and bias_grad else [])
        parts = torch.autograd.grad(out, wrt, dout[qi].transpose(0, 1).double())
        for g, part, i in zip(grads, (parts[0], parts[1] * factor, parts[2]), (qi, ki, ki)):
            g[i] += part.transpose(0, 1)
        if len(parts) == 4:
            dbias += parts[3]
    out = tuple(g.to(t.dtype) for g, t in zip(grads, (qs.tensor, ks.tensor, v)))
    return (*out, dbias.to(bias.dtype) if bias_grad else None)


class VarlenBwdStandIn:
    """Stands in for ``gdpa_varlen_bwd_cute_sm100``: the backward's math, spoiled by ``fault``; records the plans and
    the grids."""

    def __init__(self, fault: str):
        self.fault, self.plans, self.grids = fault, [], []

    def __call__(self, dout, qs, ks, v, order, activation, scale, post_scale, negative_slope, causal=False,
                 window=(-1, -1), bias=None, bias_grad=False, plan=None, ctas=None):
        self.plans.append(plan)
        self.grids.append(ctas)
        if self.fault == "raises on compile":
            raise RuntimeError("DSLRuntimeError: the kernel did not compile (stand-in)")
        assert (bias is not None, bias_grad) == (bool(plan.bias), plan.bias_grad), "the launch's bias is its build's"
        last = int(order[qs.batch - 1])

        def spoil(z):
            return {"mask ignored": (False, (-1, -1), True, 1.0),
                    "bias ignored": (causal, window, False, 1.0),
                    "last sample's dk times 1.02": (causal, window, True, 1.02 if z == last else 1.0),
                    }.get(self.fault, (causal, window, True, 1.0))

        dq, dk, dv, dbias = _grads_on_sides(dout, qs, ks, v, order, activation, scale, post_scale, negative_slope,
                                            causal, window, bias, bias_grad, spoil)
        if self.fault == "one NaN in dv":
            dv.view(-1)[0] = float("nan")
        return dq, dk, dv, dbias


class Triton:
    """Stands in for ``gdpa_varlen_bwd_triton``: the reference's gradients; counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, dout, qs, ks, v, bias, schedule, activation, scale, post_scale, causal, window, negative_slope,
                 bias_requires_grad, traced=False):
        self.calls += 1
        return _grads_on_sides(dout.tensor, qs, ks, v, row(schedule, ORDER), activation, scale, post_scale,
                               negative_slope, causal, window, bias, bias_requires_grad)


@pytest.fixture
def sm100(monkeypatch, sm100_machine):
    """CPU tensors as an sm_100 GPU's with the CuTe stack and Triton (the sides scheduled by PyTorch); returns
    ``install(fault)``, which puts a Blackwell varlen backward stand-in in place, the Triton stand-in, and the
    variants checked."""
    triton = Triton()
    monkeypatch.setattr("gdpa_inductor.kernels.triton.varlen_bwd.gdpa_varlen_bwd_triton", triton)

    def install(fault: str) -> VarlenBwdStandIn:
        kernel = VarlenBwdStandIn(fault)
        monkeypatch.setattr("gdpa_inductor.kernels.cute.varlen_bwd.gdpa_varlen_bwd_cute_sm100", kernel)
        return kernel

    return install, triton, sm100_machine


# the calls' masks: (causal, window)
MASKS = {"plain": (False, (-1, -1)), "causal": (True, (-1, -1)), "a window": (False, (20, 5)),
         "causal in a window": (True, (30, -1))}


def _call(gen, mask, d=64, dtype=torch.bfloat16, bias=None, bias_grad=False):
    """The varlen backward's arguments of a jagged call: three samples, one empty, grouped heads."""
    causal, window = MASKS[mask]
    cu_q = torch.tensor([0, 90, 90, 150], dtype=torch.int32)
    cu_k = torch.tensor([0, 120, 120, 170], dtype=torch.int32)
    q, dout = (torch.randn(150, 4, d, generator=gen).to(dtype) for _ in range(2))
    k, v = (torch.randn(170, 2, d, generator=gen).to(dtype) for _ in range(2))
    return (dout, q, k, v, bias, cu_q, cu_k, None, None, 90, 120, "silu", d**-0.5, 0.5, causal, window[0], window[1],
            0.01, bias_grad)


def _select(args):
    dout, q, k, v, bias, cu_q, cu_k, used_q, used_k, _, _, activation, _, _, causal, left, right, _, grad = args
    return select_varlen_backward_impl(q, k, v, bias, causal, (left, right), activation,
                                       (cu_q, cu_k, used_q, used_k), grad)


def _expected(args):
    grads = gdpa_varlen_reference_backward(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                                             else a for a in args[:15]), (args[15], args[16]), args[17], args[18])
    return grads if args[18] else grads[:3]


@pytest.mark.parametrize("mask", MASKS)
def test_a_correct_build_serves_after_one_check(sm100, gen, mask):
    install, triton, checks = sm100
    kernel = install("none")
    args = _call(gen, mask)
    for _ in range(3):
        assert _select(args) == "cute"
        grads = varlen_ops.backward_impl(*args)
        assert len(checks) == 1
    plan = kernel.plans[-1]
    causal, window = MASKS[mask]
    assert set(kernel.plans) == {plan} and plan.varlen and plan.mask_queries
    assert plan.window == (window != (-1, -1)) and plan.causal == (causal and window == (-1, -1))
    assert plan == plan_varlen_bwd_sm100(torch.bfloat16, 64, "silu", causal, window)
    checked = len(kernel.plans) - 3
    assert checked >= 2 and triton.calls == checked
    # the check runs few CTAs, each walking several tiles; the served calls take the device's grid
    assert kernel.grids == [sm100_kernels.CHECK_CTAS] * checked + [None] * 3
    assert grads[3] is None
    for got, want in zip(grads[:3], _expected(args)):
        torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)
    assert "the CuTe Blackwell backward (bfloat16, D=64, silu" in checks[0] and "varlen" in checks[0]
    assert ("causal" in checks[0]) == plan.causal and ("window" in checks[0]) == plan.window


@pytest.mark.parametrize("fault, why", [("mask ignored", "relative error"),
                                        ("last sample's dk times 1.02", "dk's relative error"),
                                        ("one NaN in dv", "dv has NaN or Inf"), ("raises on compile", "raised")])
def test_a_wrong_build_is_disabled_and_its_calls_run_triton(sm100, gen, caplog, fault, why):
    install, triton, checks = sm100
    install(fault)
    args = _call(gen, "causal")
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        for _ in range(2):
            selected = _select(args)
            varlen_ops.backward_impl(*args)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert selected == "triton" and len(warnings) == 1 and len(checks) == 1
    assert why in warnings[0] and "varlen" in warnings[0] and "disabled for this process" in warnings[0]


# the biases of the calls: (shape, dtype, its gradient wanted)
BIASES = {
    "shared, its gradient": ((90, 120), torch.bfloat16, True),
    "fp32 per sample and head, its gradient": ((3, 4, 90, 120), torch.float32, True),
    "per head": ((4, 90, 120), torch.bfloat16, False),
    "one element": ((), torch.bfloat16, False),
}


@pytest.mark.parametrize("case", BIASES)
def test_a_biased_call_runs_its_bias_build_after_its_own_check(sm100, gen, case):
    shape, dtype, bias_grad = BIASES[case]
    install, _, checks = sm100
    kernel = install("none")
    args = _call(gen, "causal", bias=torch.randn(shape, generator=gen).to(dtype), bias_grad=bias_grad)
    assert _select(args) == "cute"
    grads = varlen_ops.backward_impl(*args)
    plan = kernel.plans[-1]
    assert plan.varlen and plan.causal and plan.bias_grad == bias_grad
    assert plan.bias == ("float32" if dtype == torch.float32 or shape == () else "bfloat16")
    for got, want in zip(grads, _expected(args)):
        torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)
    assert (grads[3] is not None) == bias_grad and (not bias_grad or grads[3].shape == shape)
    assert len(checks) == 1 and "bias" in checks[0] and ("its gradient" in checks[0]) == bias_grad


@pytest.mark.parametrize("fault", ["bias ignored"])
def test_a_build_wrong_in_its_bias_is_caught(sm100, gen, caplog, fault):
    install, _, checks = sm100
    install(fault)
    args = _call(gen, "plain", bias=torch.randn(90, 120, generator=gen).bfloat16(), bias_grad=True)
    with caplog.at_level(logging.WARNING, logger="gdpa_inductor"):
        assert _select(args) == "triton"
        varlen_ops.backward_impl(*args)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "bias" in warnings[0] and "relative error" in warnings[0]


@pytest.mark.parametrize("bias, grad, why", [
    (lambda gen: torch.randn(90, 120, generator=gen).half(), False, "operands' dtype"),
    (lambda gen: torch.randn(120, 90, generator=gen).bfloat16().T, False, "keys contiguous"),
    (lambda gen: torch.randn((), generator=gen).bfloat16(), True, "a tensor only"),
])
def test_a_bias_the_kernel_does_not_take_keeps_triton_without_a_check(sm100, gen, backend, caplog, bias, grad, why):
    """Under "auto" and "cute" alike (a varlen case the CuTe kernels do not cover runs as under "auto"), with the
    reason in the debug log."""
    install, _, checks = sm100
    kernel = install("none")
    args = _call(gen, "plain", bias=bias(gen), bias_grad=grad)
    with caplog.at_level(logging.DEBUG, logger="gdpa_inductor"):
        assert _select(args) == "triton"
        backend("cute")
        assert _select(args) == "triton"
    assert sum(why in r.getMessage() for r in caplog.records) == 2
    assert checks == [] and kernel.plans == []


def test_the_check_runs_the_varlen_forwards_inputs_with_a_gradient(sm100):
    """The check's inputs: jagged and padded sides with an empty sample and lengths ending part-way through tiles,
    each with a random output gradient of the queries' layout; a window build under each of its windows."""
    from gdpa_inductor.lowering.sm100_varlen_backward import varlen_backward_check

    plan = plan_varlen_bwd_sm100(torch.bfloat16, 64, "silu", False, (20, 5))
    cases = list(varlen_backward_check(plan, torch.device("cpu")).cases())
    assert len(cases) >= 2
    for dout, q, _, _, bias, *_, window, _ in cases:
        assert dout.shape == q.shape and dout.dtype == q.dtype and bool(dout.abs().sum() > 0)
        assert bias is None and window != (-1, -1)
    layouts = {("jagged" if c[5] is not None else "padded") for c in cases}
    assert layouts == {"jagged", "padded"}


@pytest.mark.parametrize("change, taken", [(dict(), True), (dict(causal=True), True), (dict(window=(20, 5)), True),
                                           (dict(bias=True), True), (dict(d=96), False), (dict(failed=True), False)])
def test_the_compiled_graph_sends_a_covered_varlen_backward_to_the_opaque_op(sm100, change, taken):
    """``direct_launch.cute_machine`` on meta tensors: sm_100 varlen backwards the Blackwell backward may take (no
    bias) go through the opaque op, which checks the build at run time; not one whose build failed its check."""
    from gdpa_inductor.lowering import direct_launch

    d, causal, window = change.get("d", 64), change.get("causal", False), change.get("window", (-1, -1))
    q, v = (torch.empty(150, 4, d, device="meta", dtype=torch.bfloat16) for _ in range(2))
    bias = torch.empty(90, 120, device="meta", dtype=torch.bfloat16) if change.get("bias") else None
    if change.get("failed"):
        plan = plan_varlen_bwd_sm100(torch.bfloat16, d, "silu", causal, window)
        self_check._verdicts[("backward", plan)] = (False, "stand-in")
    assert direct_launch.cute_machine(q, v, bias, None, backward=True, varlen=(causal, window, "silu")) == taken
