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
