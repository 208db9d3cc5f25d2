"""Activations written out in elementwise ops that read the scores more than once (``composite_activation.py``): each
spelling that agrees with a row of the table, values and gradients, NaN and infinity included, is fused as that row
and gives eager's values and gradients; each near miss is refused with the reason, and compiles to eager's values."""

from __future__ import annotations

import math
import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from harness import AOT_EAGER_GDPA, Recorder, reset

from gdpa_inductor.patterns.composite_activation import find_composite

WRITTEN_OUT = {
    "silu": [lambda s: s * torch.sigmoid(s), lambda s: torch.sigmoid(s) * s, lambda s: s * s.sigmoid(),
             lambda s: s * torch.special.expit(s)],
    "gelu": [lambda s: 0.5 * s * (1.0 + torch.erf(s / math.sqrt(2.0))),
             lambda s: s * 0.5 * (1.0 + torch.special.erf(s * (1.0 / math.sqrt(2.0))))],
    "gelu_tanh": [lambda s: 0.5 * s * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (s + 0.044715 * s ** 3)))],
    "relu_square": [lambda s: F.relu(s) * F.relu(s)],
}
NO_ROW = "no activation of the table"
NEAR_MISSES = {  # (spelling, what the reason says)
    "where_gt0": (lambda s: torch.where(s > 0, s, 0.0), NO_ROW),  # 0 at NaN, where relu is NaN
    "maximum0": (lambda s: torch.maximum(s, torch.zeros_like(s)), NO_ROW),  # gradient 1/2 at 0, where relu's is 0
    "mul_gt0": (lambda s: s * (s > 0), NO_ROW),  # NaN at -inf, where relu is 0
    "quick_gelu": (lambda s: s * torch.sigmoid(1.702 * s), NO_ROW),
    "swish_beta": (lambda s: s * torch.sigmoid(2.0 * s), NO_ROW),
    "silu_plus": (lambda s: s * torch.sigmoid(s) + 1e-3 * s, NO_ROW),
    "hardswish": (lambda s: s * F.relu6(s + 3.0) / 6.0, NO_ROW),  # gradient NaN at +inf (inf * 0), hardswish's 1
    "silu_squared": (lambda s: (s * torch.sigmoid(s)) ** 2, "unsupported op pow"),  # silu, then a square
}


def _cases():
    return [(name, i, act) for name, acts in WRITTEN_OUT.items() for i, act in enumerate(acts)]


def _block(act):
    def fn(q, k, v):
        return act(q @ k.transpose(-2, -1) * 0.5) @ v
    return fn


def _inputs(dtype, requires_grad=False):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 2, 12, 16, generator=gen).to(dtype).requires_grad_(requires_grad) for _ in range(3)]


def _fused(fn, inputs) -> tuple[list[str], list[str]]:
    reset()
    recorder = Recorder(then_backend=False)
    with torch.no_grad():
        torch.compile(fn, backend=recorder)(*inputs)
    return [r.details["activation"] for r in recorder.reports if r.matched], [r.reason for r in recorder.reports]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name, index, act", _cases(), ids=[f"{n}-{i}" for n, i, _ in _cases()])
def test_written_out_activation_fuses_as_its_row(name, index, act, dtype):
    fn = _block(act)
    assert _fused(fn, _inputs(dtype))[0] == [name]
    leaves = _inputs(dtype, requires_grad=True)
    reset()
    out = torch.compile(fn, backend=AOT_EAGER_GDPA)(*leaves)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    grads = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    ref = fn(*ref_leaves)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout.double())
    eager_leaves = [x.detach().requires_grad_() for x in leaves]
    eager = fn(*eager_leaves)
    eager_grads = torch.autograd.grad(eager, eager_leaves, dout)
    for got, want, own in zip((out, *grads), (ref, *ref_grads), (eager, *eager_grads)):
        err, own_err = (got.double() - want).abs().max(), (own.double() - want).abs().max()
        assert err <= 2.0 * own_err + 1e-5 * want.abs().max(), (name, index, float(err), float(own_err))


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_near_miss_is_refused_with_the_reason(name):
    act, reason = NEAR_MISSES[name]
    fn = _block(act)
    fused, reasons = _fused(fn, _inputs(torch.float32))
    assert fused == []
    assert any(reason in r for r in reasons), reasons
    q, k, v = _inputs(torch.float32)
    reset()
    torch.testing.assert_close(torch.compile(fn, backend=AOT_EAGER_GDPA)(q, k, v), fn(q, k, v), equal_nan=True)


class _WithExamples(fx.Interpreter):
    """Runs a traced function, leaving each node's value as its example value, as Dynamo's graphs carry them."""

    def run_node(self, node):
        value = super().run_node(node)
        node.meta["example_value"] = value
        return value


def _product_node(f) -> fx.Node:
    """The multiplication node of ``f`` traced and run on a [4, 4] input."""
    gm = fx.symbolic_trace(f)
    _WithExamples(gm).run(torch.randn(4, 4))
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.mul)


def test_a_value_read_outside_the_activation_is_no_composite():
    """``s * sigmoid(s)`` whose sigmoid is also returned: that value is read elsewhere, so no composite is taken."""
    def shared(s):
        g = torch.sigmoid(s)
        return s * g, g

    assert find_composite(_product_node(shared)) == (None, None)
    composite, why = find_composite(_product_node(lambda s: s * torch.sigmoid(s)))
    assert why is None and composite.activation == "silu" and len(composite.members) == 2


def test_a_reader_outside_a_refused_subgraph_is_named_as_such():
    """(s * sigmoid(s)) / 8 is refused as a whole and then read as silu and a scale; s read once more outside them
    is reported as that, not as the refusal."""
    def fn(q, k, v):
        s = q @ k.transpose(-2, -1) * 0.5
        return (s * torch.sigmoid(s) / 8.0) @ v, s.sum()

    fused, reasons = _fused(fn, _inputs(torch.float32))
    assert fused == []
    assert any("also used elsewhere" in r for r in reasons) and not any(NO_ROW in r for r in reasons), reasons

    def alone(q, k, v):
        s = q @ k.transpose(-2, -1) * 0.5
        return (s * torch.sigmoid(s) / 8.0) @ v

    assert _fused(alone, _inputs(torch.float32))[0] == ["silu"]
