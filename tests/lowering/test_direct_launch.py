"""The direct ops (``lowering/direct_launch.py``): registered by the rewrite, not by ``import gdpa_inductor``, and
traced by AOT autograd into their bodies. On the CPU a body calls the opaque op (the GPU tests check the Triton
launches), so the graphs after AOT autograd hold the opaque ops and no direct one, and the values are eager's."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_compiler

from gdpa_inductor.patterns.rewrite import rewrite_gdpa


def test_import_registers_no_direct_op():
    code = ("import torch, gdpa_inductor\n"
            "print(hasattr(torch.ops.gdpa, 'attention_fwd_v1'), hasattr(torch.ops.gdpa, 'attention_fwd_direct_v1'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"]


def _aot_graphs(fn, *inputs):
    """fn's output under backend="gdpa" with AOT autograd alone, and the op names of its forward and backward
    graphs."""
    names = []

    def record(gm, _):
        names.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    inner = aot_autograd(fw_compiler=make_boxed_compiler(record), bw_compiler=make_boxed_compiler(record))

    def backend(gm, example_inputs):
        assert sum(r.matched for r in rewrite_gdpa(gm, example_inputs)) == 1
        return inner(gm, example_inputs)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(*inputs)
    out.sum().backward()
    return out, names


def _dense(q, k, v):
    return F.silu(q @ k.transpose(-2, -1) * 0.25) @ v


def _padded(q, k, v, lengths):
    n = q.shape[-2]
    valid = torch.arange(n)[None, :] < lengths[:, None]
    p = F.gelu(q @ k.transpose(-2, -1) * 0.25).masked_fill(~valid[:, None, None, :], 0.0)
    return p @ v


@pytest.mark.parametrize("case", ["dense", "varlen"])
def test_direct_ops_trace_into_their_bodies(case, gen):
    q, k, v = (torch.randn(2, 2, 12, 8, generator=gen, requires_grad=True) for _ in range(3))
    fn, inputs = (_dense, (q, k, v)) if case == "dense" else (_padded, (q, k, v, torch.tensor([12, 5])))
    out, (forward, backward) = _aot_graphs(fn, *inputs)
    opaque = {"dense": ("gdpa.attention_fwd_v1.default", "gdpa.attention_bwd_v1.default"),
              "varlen": ("gdpa.varlen_fwd_v2.default", "gdpa.varlen_bwd_v2.default")}[case]
    assert opaque[0] in forward and opaque[1] in backward, (forward, backward)
    assert not any("direct" in name for name in forward | backward)
    torch.testing.assert_close(out, fn(*inputs), rtol=1e-5, atol=1e-5)


def _operands(batch, n, d=128, heads=4):
    return (torch.empty(batch, heads, n, d, device="meta") for _ in range(3))


@pytest.mark.parametrize("backward", [False, True])
def test_small_calls_stay_launched_by_the_graph_large_ones_take_cute(backward):
    from gdpa_inductor.lowering.direct_launch import cute_worth_opaque_call, dense_flops

    assert not cute_worth_opaque_call(dense_flops(*_operands(64, 256), causal=True), backward)[0]
    worth, reason = cute_worth_opaque_call(dense_flops(*_operands(1152, 1024), causal=False), backward)
    assert worth and "more than the opaque call's host time" in reason


def test_the_backward_takes_cute_at_less_work_than_the_forward():
    from gdpa_inductor.lowering.direct_launch import cute_worth_opaque_call, dense_flops

    flops = dense_flops(*_operands(1152, 256), causal=False)
    assert not cute_worth_opaque_call(flops, backward=False)[0]
    assert cute_worth_opaque_call(flops, backward=True)[0]


def test_dense_flops_count_the_broadcast_batch_and_half_the_keys_where_causal():
    from gdpa_inductor.lowering.direct_launch import dense_flops

    q, k, v = _operands(2, 512, d=64)
    full = dense_flops(q, k, v, causal=False)
    assert full == 2 * 2 * 4 * 512 * 512 * 128
    assert dense_flops(q, k, v, causal=True) == pytest.approx(full * 513 / 1024)
    seeds = torch.empty(1, 4, 512, 64, device="meta")
    assert dense_flops(seeds, k, v, causal=False) == full


def test_varlen_flops_read_every_layout():
    from gdpa_inductor.lowering.direct_launch import varlen_flops

    padded = [torch.empty(6, 256, 4, 64, device="meta") for _ in range(3)]
    full = 2 * 6 * 256 * 4 * 256 * 128
    # padded q and k (seqused): max_seqlen is 0 there, the padded length counts
    assert varlen_flops(*padded, None, None, 0, False, (-1, -1)) == full
    assert varlen_flops(*padded, None, None, 0, False, (31, 32)) == full / 4
    seeds = torch.empty(1, 256, 4, 64, device="meta")
    assert varlen_flops(seeds, *padded[1:], None, None, 0, False, (-1, -1)) == full
    jagged = [torch.empty(6 * 256, 4, 64, device="meta") for _ in range(3)]
    cu = torch.empty(7, dtype=torch.int32, device="meta")
    assert varlen_flops(*jagged, cu, cu, 256, False, (-1, -1)) == full
    assert varlen_flops(seeds, *jagged[1:], None, cu, 256, False, (-1, -1)) == full
def test_under_cuda_graphs_the_cute_kernels_are_always_worth_the_call():
    from torch._inductor import config as inductor_config

    from gdpa_inductor.lowering.direct_launch import cute_worth_opaque_call

    with inductor_config.patch({"triton.cudagraphs": True}):
        assert cute_worth_opaque_call(1.0, backward=False)[0]
    assert not cute_worth_opaque_call(1.0, backward=False)[0]
