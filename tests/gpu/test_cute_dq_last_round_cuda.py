"""GPU check of dQ rounded inside the CuTe backward by the last CTA of each head (``kernels/cute/dq_last_round``):
against the pass after the kernel and against float64, over both layouts of the fp32 sums (80-row tiles' fragments,
64-row tiles' rows), ragged tiles, one query, many heads, causal, a bias tensor with its gradient, fp16, D = 64 and
96; the kept workspace (``dq_workspace``) zero after every call, also between calls of other sizes; and the launcher
taking it by default wherever ``dq_last_round_for`` says."""

from __future__ import annotations

import pytest
import torch

from gdpa_inductor.kernels.cute import dq_workspace, gdpa_bwd
from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.cute.kernel_build import compile_bwd
from gdpa_inductor.kernels.reference import gdpa_reference_backward

from .cute_common import FLOOR, NEEDS_CUTE, dense_bwd_plan, eager_grads, rel_error

pytestmark = NEEDS_CUTE

# (Z, H, Nq, Nk, D, activation, dtype, query tile, causal, bias tensor)
CASES = [
    (2, 3, 2048, 2048, 128, "gelu_tanh", torch.bfloat16, 80, False, False),
    (1, 2, 2000, 1000, 128, "silu", torch.float16, 80, False, False),
    (3, 2, 160, 384, 128, "gelu_tanh", torch.bfloat16, 80, False, False),
    (2, 2, 79, 129, 128, "sigmoid", torch.float16, 80, False, False),
    (1, 5, 1, 300, 128, "relu", torch.bfloat16, 80, False, False),
    (2, 3, 2048, 2048, 128, "gelu_tanh", torch.bfloat16, 64, False, False),
    (2, 3, 2000, 1100, 64, "silu", torch.bfloat16, 64, False, False),
    (1, 2, 1000, 2045, 64, "relu", torch.float16, 64, False, False),
    (2, 2, 1024, 1024, 128, "silu", torch.bfloat16, 64, True, False),
    (1, 2, 1024, 2048, 64, "sigmoid", torch.bfloat16, 64, True, False),
    (2, 2, 1030, 1500, 128, "hardswish", torch.bfloat16, 64, False, True),
    (1, 1, 100, 1200, 96, "gelu_tanh", torch.bfloat16, 64, False, False),
    (32, 8, 200, 1300, 64, "silu", torch.bfloat16, 64, False, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(x).replace("torch.", "") for x in c))
def test_dq_rounded_in_the_kernel_like_the_pass_after_it(case):
    """dQ within two ulps of its largest value of the pass's (the fp32 sums' order follows the CTAs' arrivals), three
    runs (a last CTA that read a head's sums before every add had landed would be off by whole terms), dq, dk, dv
    (and dbias) within 2x eager's error against float64."""
    z, h, nq, nk, d, act, dtype, tile, causal, with_bias = case
    gen = torch.Generator(device="cuda").manual_seed(nq * 7 + nk + d)
    q, do = (torch.randn(z, h, nq, d, device="cuda", generator=gen).to(dtype) for _ in range(2))
    k, v = (torch.randn(z, h, nk, d, device="cuda", generator=gen).to(dtype) for _ in range(2))
    bias = torch.randn(z, h, nq, nk, device="cuda", generator=gen).to(dtype) if with_bias else None
    scale, post = d**-0.5, 1.0 / nk
    kw = dict(causal=causal, bias=bias, bias_grad=with_bias)
    plans = {rounds: dense_bwd_plan(q, k, v, act, dq_sums="fp32", query_tile=tile, dq_last_round=rounds, **kw)
             for rounds in (False, True)}
    base = gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, plan=plans[False], **kw)
    bound = 2 * torch.finfo(dtype).eps * base[0].float().abs().max().item()
    for _ in range(3):
        got = gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, plan=plans[True], **kw)
        assert got[0].dtype == dtype and got[0].shape == q.shape
        assert (got[0].float() - base[0].float()).abs().max().item() <= bound
        assert_workspace_zero()
    ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(),
                                  None if bias is None else bias.double(), act, scale, post, causal=causal,
                                  bias_requires_grad=with_bias)
    if not (causal or with_bias):
        eager = eager_grads(q, k, v, do, act, scale, post)
        for name, g, e, r in zip(("dq", "dk", "dv"), got, eager, ref):
            assert rel_error(g, r) <= 2 * rel_error(e, r) + FLOOR, (name, rel_error(g, r), rel_error(e, r))
    for name, g, b, r in zip(("dq", "dk", "dv", "dbias"), got, base, ref):
        if r is not None:
            assert rel_error(g, r) <= 1.05 * rel_error(b, r) + FLOOR, (name, rel_error(g, r), rel_error(b, r))


def test_dq_rounded_in_the_kernel_keeps_nonfinite_values_like_eager():
    """An inf key: dQ's NaN and inf where eager has them, the rows past the last whole tile not written."""
    q, do = (torch.randn(1, 2, 130, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 2, 2100, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k[0, 1, 7, 3] = float("inf")
    for tile in (64, 80):
        plan = dense_bwd_plan(q, k, v, "sigmoid", dq_sums="fp32", query_tile=tile, dq_last_round=True)
        got = gdpa_bwd_cute(q, k, v, do, "sigmoid", 1.0, 1.0, 0.01, plan=plan)
        eager = eager_grads(q, k, v, do, "sigmoid", 1.0, 1.0)
        assert torch.equal(got[0].isnan(), eager[0].isnan()) and torch.equal(got[0].isinf(), eager[0].isinf())
        assert_workspace_zero()


def assert_workspace_zero():
    """Every kept sum and count zero again (a NaN or a leftover would land in the next call's dQ)."""
    torch.cuda.synchronize()
    assert dq_workspace._WORKSPACES
    for buffer in dq_workspace._WORKSPACES.values():
        assert torch.equal(buffer, torch.zeros_like(buffer))


def test_calls_of_other_sizes_share_the_workspace_after_one_another():
    """A large call, smaller ones of both sum layouts inside its buffer, a larger one that grows it: each like the
    pass after the kernel."""
    dq_workspace.release_dq_workspaces()
    for z, h, nq, nk, d, tile in [(2, 4, 2048, 2048, 128, 80), (1, 3, 700, 1500, 64, 64), (3, 2, 1000, 1200, 128, 80),
                                  (4, 4, 2048, 2048, 128, 64), (1, 1, 90, 2000, 128, 80)]:
        q, do = (torch.randn(z, h, nq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(z, h, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        base, got = (gdpa_bwd_cute(q, k, v, do, "silu", d**-0.5, 1.0 / nk, 0.01, plan=dense_bwd_plan(
            q, k, v, "silu", dq_sums="fp32", query_tile=tile, dq_last_round=rounds))[0] for rounds in (False, True))
        bound = 2 * torch.finfo(q.dtype).eps * base.float().abs().max().item()
        assert (got.float() - base.float()).abs().max().item() <= bound, (z, h, nq, nk, d, tile)
        assert_workspace_zero()


@pytest.mark.parametrize("nk, d, rounds", [(2048, 128, True), (1100, 64, True), (512, 128, False), (2048, 256, False)])
def test_the_launcher_rounds_in_the_kernel_where_dq_sums_in_fp32(monkeypatch, nk, d, rounds):
    built = []
    monkeypatch.setattr(gdpa_bwd, "compile_bwd",
                        lambda plan, **kw: built.append(plan.dq_last_round) or compile_bwd(plan, **kw))
    q, do = (torch.randn(1, 2, 300, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 2, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gdpa_bwd_cute(q, k, v, do, "silu", 0.1, 0.01, 0.01)
    assert built == [rounds]
