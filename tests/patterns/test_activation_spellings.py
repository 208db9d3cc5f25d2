"""Every FX spelling the activation table gives (``ActivationSpec.fx``) is read by the matcher as its row: each call
node on its own (``fx_nodes.activation_of``), and each spelling Dynamo records in a compiled program, fused with the
row's activation."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from harness import Recorder, reset

from gdpa_inductor.kernels.activations import ACTIVATIONS, ActivationSpec
from gdpa_inductor.patterns import fx_nodes as fxn

SLOPE = 0.2


def _spellings() -> list[tuple[ActivationSpec, str, object]]:
    """(row, "function" or "method", target) for every call the table spells an activation by."""
    return [(a, "function", f) for a in ACTIVATIONS.values() for f in a.fx.functions] + [
        (a, "method", m) for a in ACTIVATIONS.values() for m in a.fx.methods]


def _id(spelling) -> str:
    a, kind, target = spelling
    return f"{a.name}-{kind}-{getattr(target, '__qualname__', target)}"


def _keywords(a: ActivationSpec) -> dict:
    keywords = {}
    if a.fx.approximate is not None:
        keywords["approximate"] = a.fx.approximate
    if a.fx.reads_slope:
        keywords["negative_slope"] = SLOPE
    return keywords


@pytest.mark.parametrize("spelling", _spellings(), ids=_id)
def test_each_call_node_reads_as_its_row(spelling):
    a, kind, target = spelling
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.randn(4, 4)
    node = graph.create_node("call_function" if kind == "function" else "call_method", target, (x,), _keywords(a))
    assert fxn.activation_of(node) == (a.name, SLOPE if a.fx.reads_slope else 0.01)


@pytest.mark.parametrize("name", [a.name for a in ACTIVATIONS.values() if a.fx.square_of is not None])
def test_squared_rows_follow_their_call(name):
    a = ACTIVATIONS[name]
    assert fxn.SQUARED_ACTIVATIONS[a.fx.square_of] == name
    assert ACTIVATIONS[a.fx.square_of].fx.functions, "a square follows an activation spelled by a call"


def _compiled_activation(act) -> list[str]:
    """The activations the pass fused in ``act(q kᵀ) @ v``."""
    def fn(q, k, v):
        return act(q @ k.transpose(-2, -1) * 0.5) @ v

    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    reset()
    recorder = Recorder(then_backend=False)
    with torch.no_grad():
        torch.compile(fn, backend=recorder)(q, k, v)
    return [r.details["activation"] for r in recorder.reports if r.matched]


def _programs() -> list[tuple[str, object]]:
    """(row, a callable applying it) for every spelling a program can write: each function, each method torch.Tensor
    has, and each squared row as its call then ``** 2``."""
    programs = []
    for a, kind, target in _spellings():
        keywords = _keywords(a)
        if kind == "function":
            programs.append((a.name, lambda s, f=target, kw=keywords: f(s, **kw)))
        elif hasattr(torch.Tensor, target):
            programs.append((a.name, lambda s, m=target, kw=keywords: getattr(s, m)(**kw)))
    for a in ACTIVATIONS.values():
        if a.fx.square_of is not None:
            base = ACTIVATIONS[a.fx.square_of].fx.functions[0]
            programs.append((a.name, lambda s, f=base: f(s) ** 2))
    return programs


@pytest.mark.parametrize("name, act", _programs(), ids=[f"{n}-{i}" for i, (n, _) in enumerate(_programs())])
def test_each_spelling_fuses_as_its_row(name, act):
    assert _compiled_activation(act) == [name]
