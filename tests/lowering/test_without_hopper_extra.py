"""The CuTe-DSL stack is an optional extra (``gdpa-inductor[hopper]``): without it the op, its gradients and the
backend run on the other paths, and nothing imports it. Each case runs in a fresh interpreter where the packages
cannot be imported (``sys.modules[name] = None`` makes ``import`` fail and ``find_spec`` report them missing)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BLOCK = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None\n"

OP_AND_BACKEND = """
import torch
import gdpa_inductor
from gdpa_inductor.kernels.cute.fwd_support import cute_dsl_available

assert not cute_dsl_available()
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 2, 24, 16, generator=g, dtype=torch.float32, requires_grad=True) for _ in range(3))
bias = torch.randn(24, 24, generator=g, dtype=torch.float32, requires_grad=True)
out = gdpa_inductor.gdpa(q, k, v, activation="silu", scale=0.25, bias=bias, causal=True)
out.sum().backward()
assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v, bias))

lengths = torch.tensor([0, 7, 24], dtype=torch.int32)
tokens = int(lengths[-1])
qv, kv, vv = (torch.randn(tokens, 2, 16, generator=g, dtype=torch.float32, requires_grad=True) for _ in range(3))
gdpa_inductor.gdpa_varlen(qv, kv, vv, lengths, lengths, 17, 17, activation="relu", causal=True).sum().backward()
assert qv.grad is not None

def attention(q, k, v):
    return torch.nn.functional.silu(q @ k.transpose(-2, -1) * 0.25) @ v

torch.compile(attention, backend="gdpa")(q, k, v).sum().backward()
assert torch._dynamo.utils.counters["gdpa"]["rewrites"] == 1
blocked = [name for name in {names!r} if sys.modules.get(name) is not None]
assert not blocked, blocked
print("ok")
"""


@pytest.mark.parametrize("names, backend", [(("cutlass",), "auto"), (("tvm_ffi",), "auto"), (("cutlass",), "triton")],
                         ids=str)
def test_op_gradients_and_backend_without_the_cute_stack(names, backend):
    code = BLOCK.format(names=names) + textwrap.dedent(OP_AND_BACKEND).format(names=names)
    env = {**os.environ, "GDPA_INDUCTOR_BACKEND": backend, "PYTHONPATH": str(ROOT)}
    # on CPU "auto" runs the reference (no interpreter), "triton" the Triton kernels through the interpreter
    if backend == "auto":
        env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
