"""What the varlen GPU tests share: the op's forward and every gradient against the float64 oracle of
tests/varlen_testing.py, each within 2x of the oracle's own math in the same dtype (eager) at the same inputs."""

from __future__ import annotations

import torch
from gdpa_testing import randn
from varlen_testing import VarlenCase, make_case, oracle

from gdpa_inductor import gdpa_varlen

from .cute_common import FLOOR


def rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def check(case, dtype, bias=None, bias_grad=True, **params):
    """Runs the op and the oracle on ``case`` with a fresh output gradient; returns the op's (out, dq, dk, dv,
    dbias where ``bias`` is given and ``bias_grad``) after asserting each is within the bound."""
    params = dict(activation="silu", scale=case.q.shape[-1] ** -0.5, post_scale=0.5) | params
    forward = oracle(case, **params)
    results = {}

    def leaves(dt):
        b = [] if bias is None else [bias.detach().to(dt).requires_grad_(bias_grad)]
        return (*case.inputs(dt), *b)

    def wrt(inputs):
        return inputs if bias_grad else inputs[:3]

    for name, dt in (("ref", torch.float64), ("eager", dtype)):
        inputs = leaves(dt)
        out = forward(*inputs)
        dout = torch.randn(out.shape, generator=torch.Generator("cuda").manual_seed(5), device="cuda",
                           dtype=torch.float64).to(dt)
        results[name] = (out, *torch.autograd.grad(out, wrt(inputs), dout))
    q, k, v, *b = leaves(dtype)
    out = gdpa_varlen(q, k, v, **case.kwargs, **params, bias=b[0] if b else None)
    dout = torch.randn(out.shape, generator=torch.Generator("cuda").manual_seed(5), device="cuda",
                       dtype=torch.float64).to(dtype)
    got = (out, *torch.autograd.grad(out, wrt((q, k, v, *b)), dout))
    bad = []
    for name, g, e, r in zip(("out", "dq", "dk", "dv", "dbias"), got, results["eager"], results["ref"]):
        assert g.shape == r.shape and g.dtype == dtype, (name, g.shape, r.shape, g.dtype)
        err, eager_err = rel(g, r), rel(e, r)
        if not err <= 2 * eager_err + FLOOR:
            bad.append(f"{name}: {err:.3g} > 2 x eager {eager_err:.3g}")
    assert not bad, "; ".join(bad)
    return got


# three samples, the poisoned rows the first of the second, right behind the first one's ragged last tile
POISON_LENGTHS = [100, 150, 77]


def poison_second_sample(case, which: str) -> torch.Tensor:
    """NaN, Inf and -Inf into head 1 of the first three rows of sample 1 of ``case`` (lengths ``POISON_LENGTHS``,
    jagged) in ``which`` of "q", "k" and "v"; returns the row indices of samples 0 and 2."""
    tensor = {"q": case.q, "k": case.k, "v": case.v}[which]
    tensor[100:103, 1] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=tensor.dtype,
                                      device=tensor.device)[:, None]
    return torch.cat([torch.arange(0, 100), torch.arange(250, 327)]).cuda()


def assert_poison_stays_in_its_sample(gen, which: str, **mask):
    """NaN and Inf in the first rows of sample 1 (``poison_second_sample``), right behind sample 0's ragged last
    tile: the output and the gradients of samples 0 and 2 (one key tile each, so their dQ sums have one order)
    are as without them, bit for bit, under ``mask`` (the op's causal and window arguments)."""
    case = make_case("self", gen, h=4, hkv=4, d=128, dv=128, lq=POISON_LENGTHS).to("cuda")

    def run():
        q, k, v = (t.detach().to(torch.bfloat16).requires_grad_() for t in case.inputs(torch.float64))
        out = gdpa_varlen(q, k, v, **case.kwargs, activation="silu", **mask)
        dout = torch.randn(out.shape, generator=torch.Generator("cuda").manual_seed(3), device="cuda").to(out.dtype)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    clean = run()
    others = poison_second_sample(case, which)
    for got, want in zip(run(), clean):
        assert torch.equal(got[others], want[others])


def dense_case(gen, nq: int, nk: int, b=3, h=4, hkv=2, d=128, dv=128) -> VarlenCase:
    """Full dense sides [B, N, H, D], no lengths: every sample has Nq queries and Nk keys."""
    q = randn(gen, b, nq, h, d, dtype=torch.float64)
    k = randn(gen, b, nk, hkv, d, dtype=torch.float64)
    v = randn(gen, b, nk, hkv, dv, dtype=torch.float64)
    kw = dict(cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None, max_seqlen_q=nq,
              max_seqlen_k=nk)
    return VarlenCase(q, k, v, kw, [nq] * b, [nk] * b)
