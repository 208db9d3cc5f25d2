"""Compiled graphs launch the fused Triton kernels themselves: with static shapes, where the CuTe kernels are not
worth the opaque call's host time (no CuTe stack, or a small call), Inductor's code for the forward and backward
graphs holds the kernels' launches and no call of the opaque ops, and the values and gradients are eager's; a large
call on a machine with the CuTe stack stays an opaque call that runs them."""

from __future__ import annotations

import re

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from gdpa_inductor.demo import DemoRecModel, make_batch
from gdpa_inductor.kernels.cute.fwd_support import machine_support

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

KERNEL = re.compile(r"def (gdpa\w*_kernel|varlen_\w+_kernel)\(")
# a call of an opaque op: the op that chooses its kernel when it runs
OPAQUE_CALL = re.compile(r"gdpa\.(attention|varlen)_(fwd|bwd)_v\d")


def _compiled_step(fn, *inputs):
    """fn's output and input gradients under backend="gdpa", and the kernels Inductor's code defines."""
    torch._dynamo.reset()
    rewrites = counters["gdpa"]["rewrites"]
    compiled = torch.compile(fn, backend="gdpa")
    result = {}

    def step():
        out = compiled(*inputs)
        out.float().square().mean().backward()
        result["out"] = out.detach()

    _, codes = run_and_get_code(step)
    code = "\n".join(codes)
    return result["out"], counters["gdpa"]["rewrites"] - rewrites, set(KERNEL.findall(code)), code


def _rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def test_dense_forward_and_backward_launch_from_the_graph():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 2, 96, 64, device="cuda", generator=gen, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 96, 96, device="cuda", generator=gen, requires_grad=True)

    def attention(q, k, v, bias):
        return torch.nn.functional.silu(q @ k.transpose(-2, -1) * 0.125 + bias) @ v

    out, rewrites, kernels, code = _compiled_step(attention, q, k, v, bias)
    assert rewrites == 1
    assert kernels == {"gdpa_fwd_kernel", "gdpa_bwd_dkdv_kernel", "gdpa_bwd_dq_kernel"}
    assert not OPAQUE_CALL.search(code)
    grads = [t.grad for t in (q, k, v, bias)]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
    expected = attention(*leaves)
    expected.square().mean().backward()
    assert _rel(out, expected.detach()) < 1e-5
    assert all(_rel(g, leaf.grad) < 1e-5 for g, leaf in zip(grads, leaves))


def test_the_demo_model_launches_every_kernel_from_the_graph():
    torch.manual_seed(0)
    model = DemoRecModel(128, 4, seeds=4, dff=16, max_len=64).cuda()
    batch = make_batch(8, 64, 128, "cuda", torch.float32)
    out, rewrites, kernels, code = _compiled_step(model, *batch)
    assert rewrites == 3
    assert kernels == {"gdpa_fwd_kernel", "gdpa_bwd_dkdv_kernel", "gdpa_bwd_dq_kernel", "gdpa_varlen_fwd_kernel",
                       "gdpa_varlen_bwd_dkdv_kernel", "gdpa_varlen_bwd_dq_kernel", "varlen_schedule_kernel"}
    assert not OPAQUE_CALL.search(code)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model.double()(*[t.double() if t.is_floating_point() else t for t in batch])
    expected.square().mean().backward()
    assert _rel(out, expected.detach()) < 1e-5
    assert all(_rel(g, p.grad) < 1e-4 for g, p in zip(grads, model.parameters()))


def test_jagged_rows_launch_from_the_graph_and_unread_rows_get_zero_gradients():
    """HSTU's reference spelling (jagged rows padded by a gather, a mask from arange and eye, the valid rows read
    back) on offsets that leave rows unread: before the first sample, after a sample longer than N, after the last.
    Every launch is in the graph, one of them the zeroing of the unread rows, which get eager's zero gradients."""
    n, h, d = 64, 2, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    offsets = torch.tensor([3, 40, 140, 150, 190], device="cuda")
    q, k, v = (torch.randn(200, h, d, device="cuda", generator=gen, requires_grad=True) for _ in range(3))
    lengths = (offsets[1:] - offsets[:-1]).clamp(max=n).tolist()
    rows = torch.cat([z * n + torch.arange(length) for z, length in enumerate(lengths)]).cuda()

    def padded(x, offsets):
        pos = torch.arange(n, device=x.device)[None, :]
        src = (offsets[:-1, None] + pos).clamp(max=x.shape[0] - 1)
        valid = (pos < (offsets[1:] - offsets[:-1])[:, None])[..., None, None]
        return (x[src] * valid).transpose(1, 2)

    def attention(q, k, v, offsets, rows):
        qp, kp, vp = (padded(t, offsets) for t in (q, k, v))
        ids = torch.arange(n, device=q.device)
        mask = torch.logical_or(torch.eye(n, device=q.device, dtype=torch.bool), ids.view(n, 1) > ids.view(1, n))
        p = torch.nn.functional.silu(torch.einsum("bhxa,bhya->bhxy", qp, kp) * d**-0.5) / n * mask
        out = torch.einsum("bhxy,bhyd->bhxd", p, vp)
        return out.transpose(1, 2).reshape(-1, h, d)[rows]

    out, rewrites, kernels, code = _compiled_step(attention, q, k, v, offsets, rows)
    assert rewrites == 1
    assert kernels == {"varlen_schedule_kernel", "gdpa_varlen_fwd_kernel", "varlen_zero_gaps_kernel",
                       "gdpa_varlen_bwd_dkdv_kernel", "gdpa_varlen_bwd_dq_kernel"}
    assert not OPAQUE_CALL.search(code)
    grads = [t.grad for t in (q, k, v)]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = attention(*leaves, offsets, rows)
    expected.square().mean().backward()
    assert _rel(out, expected.detach()) < 1e-5
    unread = torch.ones(200, dtype=torch.bool, device="cuda")
    for start, length in zip(offsets.tolist(), lengths):
        unread[start:start + length] = False
    for g, leaf in zip(grads, leaves):
        assert _rel(g, leaf.grad) < 1e-5
        assert bool((g[unread] == 0).all())


@pytest.mark.skipif(not torch.cuda.is_available() or not machine_support(torch.device("cuda"))[0],
                    reason="needs the CuTe stack on an sm_90 GPU")
def test_a_large_call_stays_an_opaque_call_for_the_cute_kernels():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(128, 4, 2048, 128, device="cuda", dtype=torch.bfloat16, generator=gen,
                           requires_grad=True) for _ in range(3))

    def attention(q, k, v):
        return torch.nn.functional.gelu(q @ k.transpose(-2, -1) * 0.088, approximate="tanh") @ v

    _, rewrites, kernels, code = _compiled_step(attention, q, k, v)
    assert rewrites == 1
    assert not kernels & {"gdpa_fwd_kernel", "gdpa_bwd_dkdv_kernel", "gdpa_bwd_dq_kernel"}
    assert set(OPAQUE_CALL.findall(code)) == {("attention", "fwd"), ("attention", "bwd")}
