"""In-place changes in the traced graph: a block whose inputs change in place between its reads and the fused op's,
or that reads a tensor after an in-place change a proof cannot see, is left to Inductor; in-place spellings whose
result is what the block reads are still fused, and so are the block's own steps written in place on a tensor
nothing else shares (``patterns/in_place.py``). Each model is compared with eager in float64, gradients included."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from harness import reset
from test_soundness import Fn, _qkv, compiled_vs_eager

import gdpa_inductor
from gdpa_inductor.patterns.mutation import changed_in_place, stale_readers, written

N = 16


def padded_then_changed(q, k, v, lengths):
    valid = (torch.arange(N) < lengths[:, None])[:, None, :, None]
    kp, vp = k * valid, v * valid
    kp[:, :, -1, :] = 1.0  # a padded row made nonzero after the padding
    vp[:, :, -1, :] = 1.0
    return F.silu(q @ kp.transpose(-1, -2)) @ vp


def key_changed_inside_block(q, k, v):
    k2 = k * 1.0
    s = q @ k2.transpose(-1, -2)
    k2.mul_(2)  # the fused op, at the second matmul, would read the doubled keys
    return F.silu(s) @ v


def scores_changed_without_reassignment(q, k, v):
    s = q @ k.transpose(-1, -2)
    s.masked_fill_(torch.ones(N, N, dtype=torch.bool).triu(1), -1e4)
    return torch.sigmoid(s) @ v


def scale_in_place_reassigned(q, k, v):
    s = q @ k.transpose(-1, -2)
    s = s.mul_(0.5)
    return F.silu(s) @ v


def query_scaled_in_place(q, k, v):
    q = q * 1.0
    q *= 0.3
    return F.silu(q @ k.transpose(-1, -2)) @ v


def scores_scaled_without_gradients(q, k, v):
    s = q @ k.transpose(-1, -2)
    with torch.no_grad():
        s.mul_(2.0)  # autograd does not see it: the gradients go through the scores as made
    return F.silu(s) @ v


def key_changed_after_block(q, k, v):
    k2 = k * 1.0
    out = F.silu(q @ k2.transpose(-1, -2)) @ v
    k2.add_(1.0)
    return out + k2.sum()


# (model, reads lengths, rewrites, with gradients: eager's own backward refuses keys changed after the scores saved
# them)
CASES = [
    (padded_then_changed, True, 0, True),
    (key_changed_inside_block, False, 0, False),
    (scores_changed_without_reassignment, False, 1, True),
    (scale_in_place_reassigned, False, 1, True),
    (scores_scaled_without_gradients, False, 0, True),
    (query_scaled_in_place, False, 1, True),
    (key_changed_after_block, False, 1, False),
]


@pytest.mark.parametrize("fn, with_lengths, fused, train", CASES, ids=[c[0].__name__ for c in CASES])
def test_in_place_changes_give_eagers_values(fn, with_lengths, fused, train):
    inputs = _qkv(3) + ((torch.tensor([5, 9]),) if with_lengths else ())
    rewrites, err = compiled_vs_eager(Fn(fn), *inputs, train=train)
    assert err < 1e-5
    assert rewrites == fused


@pytest.mark.parametrize("fn, reason", [
    (padded_then_changed, "reads a tensor after the graph changed it in place"),
    (key_changed_inside_block, "mul_ changes in place a tensor the block reads, before the fused op would read it"),
])
def test_explain_names_the_in_place_change(fn, reason):
    reset()
    inputs = _qkv(3) + ((torch.tensor([5, 9]),) if fn is padded_then_changed else ())
    report = str(gdpa_inductor.explain(fn, *inputs))
    assert reason in report, report


def _graph(fn, *inputs) -> fx.Graph:
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm.graph)
        return gm

    reset()
    torch.compile(fn, backend=capture)(*inputs)
    return graphs[0]


def _every_spelling(x, y):
    a = x * 1.0
    a[0] = 2.0
    b = y * 1.0
    b += 1.0
    c = x * 1.0
    c.add_(1.0)
    d = F.relu(x * 1.0, inplace=True)
    e = torch.relu_(y * 1.0)
    f = F.hardtanh(y * 1.0, -0.5, 0.5, True)  # in place by position
    return a, b, c, d, e, f


def test_every_in_place_spelling_is_a_write():
    graph = _graph(_every_spelling, torch.randn(3, 4), torch.randn(3, 4))
    writes = [n for n in graph.nodes if written(n) is not None]
    targets = {n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "") for n in writes}
    assert targets == {"setitem", "iadd", "add_", "relu", "relu_", "hardtanh"}, targets
    pure = [n for n in graph.nodes if n.op == "call_function" and n.target is operator.mul]
    assert pure and all(written(n) is None for n in pure)


def _read_through_a_view(x):
    a = x * 1.0
    before = a.sum()
    view = a.view(-1)
    view[0] = 5.0
    after = a.sum()
    return before, after


def test_a_change_through_a_view_makes_later_reads_stale():
    graph = _graph(_read_through_a_view, torch.randn(3, 4))
    sums = [n for n in graph.nodes if n.op == "call_method" and n.target == "sum"]
    assert len(sums) == 2
    assert sums[0] not in stale_readers(graph) and sums[1] in stale_readers(graph)
    base = sums[0].args[0]
    assert changed_in_place(base)
